"""The controller's loop: a tick every interval, for the queues this server leads, never
wedged.

Ticks start on a fixed schedule. A tick waits for its launches and kills only until most
of its interval is spent (``ACTING_SHARE``); a provider call still running then ends in
the background and writes its own audit row, so the next tick starts on time. A tick that
still overruns (a very large fleet) is followed by the next one at once (missed ticks are
not queued up). A tick that fails is logged and the next one runs on time: one broken
queue, provider or store hiccup never stops the loop.

Between ticks the loop listens to the server's wake-ups (every submit's, from this
replica or, on PostgreSQL, from any): a submit to a queue whose scope the last tick left
at zero — no daemon, nothing in flight, nothing pending, a ``fully_elastic``,
``max_count`` or ``wait_target`` policy — has that scope planned at once
(:meth:`Controller.nudge`), so the first launch does not wait for the next tick. So does
a submit to a queue created since the last tick (its scope looked up first: the README's
first steps create a queue, then submit to it). A scope is nudged at most once between
two ticks; ``pool_with_threshold`` is never nudged (its hysteresis counts ticks).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Final

from lakeshore import logs
from lakeshore.services.fleet.controller import Controller
from lakeshore.store.leadership import Leadership, Led

log = logging.getLogger("lakeshore.controller")

ACTING_SHARE: Final = 0.8  # of the interval, for a tick's launches and kills


async def run_forever(
    controller: Controller,
    leadership: Leadership,
    interval_s: float,
    *,
    working: asyncio.Lock | None = None,
) -> None:
    """Tick until cancelled. ``working`` is held through each tick and each nudge: whoever
    takes it stops the loop between two of them (see ``lakeshore.api.app``)."""
    loop = asyncio.get_running_loop()
    next_at = loop.time()
    working = working or asyncio.Lock()
    nudges = _Nudges(controller, working)
    led = Led(unpinned=False, pinned=False)
    try:
        with controller.notifier.tapped(nudges.heard):
            while True:
                try:
                    async with working:
                        led = await leadership.try_lead()
                        if led.anything:
                            budget = max(0.0, next_at + interval_s * ACTING_SHARE - loop.time())
                            _log(await controller.tick(led, budget_s=budget))
                except Exception:
                    log.exception("elasticity tick failed; the next one runs on schedule")
                next_at += interval_s
                if next_at < loop.time():
                    next_at = loop.time()
                await nudges.serve_until(next_at, led, interval_s)
    finally:
        await leadership.release()


class _Nudges:
    """Submits heard between ticks: a queue the last tick left at zero
    (:attr:`Controller.at_zero`) has its scope planned at once, not at the next tick."""

    def __init__(self, controller: Controller, working: asyncio.Lock) -> None:
        self.controller = controller
        self.working = working
        self.scopes: set[tuple[str, str]] = set()
        self.fresh: set[str] = set()  # queues no tick has seen yet: their scopes to look up
        self.heard_one = asyncio.Event()

    def heard(self, key: str) -> None:
        scope = self.controller.at_zero.pop(key, None)
        if scope is not None:
            self.scopes.add(scope)
            self.heard_one.set()
        elif self.controller.is_fresh(key):  # a queue created since the last tick
            self.fresh.add(key)
            self.heard_one.set()

    async def serve_until(self, deadline: float, led: Led, interval_s: float) -> None:
        loop = asyncio.get_running_loop()
        while (remaining := deadline - loop.time()) > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self.heard_one.wait()
            if not self.heard_one.is_set():
                return
            self.heard_one.clear()
            scopes, self.scopes = self.scopes, set()
            fresh, self.fresh = self.fresh, set()
            if not led.anything:
                continue  # another replica leads: its own loop hears the submit
            try:
                async with self.working:
                    budget = interval_s * ACTING_SHARE
                    scopes |= await self.controller.scopes_at_zero(fresh)
                    if scopes:
                        _log(await self.controller.nudge(scopes, led, budget_s=budget))
            except Exception:
                log.exception("planning %d scope(s) after a submit failed", len(scopes))


def _log(outcomes: list[dict[str, Any]]) -> None:
    for outcome in outcomes:
        if outcome["action"] != "tick_noop":
            log.info(
                "%s %s: %s",
                outcome["queueName"],
                outcome["action"],
                outcome["reason"],
                extra=logs.ids(
                    namespace=outcome.get("namespace"),
                    queue=outcome["queueName"],
                    action=outcome["action"],
                    launch=outcome.get("launch_id"),
                    provider=outcome.get("provider"),
                    worker=outcome.get("victim"),
                ),
            )
