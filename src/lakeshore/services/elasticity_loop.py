"""The controller's loop: a tick every interval, on the leader only, never wedged.

Ticks start on a fixed schedule; a tick that overruns its interval is followed by the
next one at once (missed ticks are not queued up). A tick that fails is logged and the
next one runs on time: one broken queue, provider or store hiccup never stops the loop.
"""

from __future__ import annotations

import asyncio
import logging

from lakeshore.services.controller import Controller
from lakeshore.store.leadership import Leadership

log = logging.getLogger("lakeshore.controller")


async def run_forever(controller: Controller, leadership: Leadership, interval_s: float) -> None:
    loop = asyncio.get_running_loop()
    next_at = loop.time()
    try:
        while True:
            try:
                if await leadership.try_lead():
                    outcomes = await controller.tick()
                    acted = [o for o in outcomes if o["action"] != "tick_noop"]
                    for outcome in acted:
                        log.info(
                            "%s %s: %s", outcome["scope"], outcome["action"], outcome["reason"]
                        )
            except Exception:
                log.exception("elasticity tick failed; the next one runs on schedule")
            next_at += interval_s
            delay = next_at - loop.time()
            if delay < 0:
                next_at, delay = loop.time(), 0.0
            await asyncio.sleep(delay)
    finally:
        await leadership.release()
