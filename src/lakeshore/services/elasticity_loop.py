"""The controller's loop: a tick every interval, for the queues this server leads, never
wedged.

Ticks start on a fixed schedule. A tick waits for its launches and kills only until most
of its interval is spent (``ACTING_SHARE``); a provider call still running then ends in
the background and writes its own audit row, so the next tick starts on time. A tick that
still overruns (a very large fleet) is followed by the next one at once (missed ticks are
not queued up). A tick that fails is logged and the next one runs on time: one broken
queue, provider or store hiccup never stops the loop.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from lakeshore.services.controller import Controller
from lakeshore.store.leadership import Leadership

log = logging.getLogger("lakeshore.controller")

ACTING_SHARE: Final = 0.8  # of the interval, for a tick's launches and kills


async def run_forever(controller: Controller, leadership: Leadership, interval_s: float) -> None:
    loop = asyncio.get_running_loop()
    next_at = loop.time()
    try:
        while True:
            try:
                led = await leadership.try_lead()
                if led.anything:
                    budget = max(0.0, next_at + interval_s * ACTING_SHARE - loop.time())
                    outcomes = await controller.tick(led, budget_s=budget)
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
