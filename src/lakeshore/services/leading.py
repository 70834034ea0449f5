"""The cluster's housekeeping — enqueuing the schedules' slots, the retention sweep —
done by one server at a time.

Any server may take it, elasticity on or off: it is an advisory lock of its own on
PostgreSQL (:func:`lakeshore.store.leadership.housekeeping`), apart from the controller's,
which only servers running the controller's loop take (a replica serving the API only
must not keep the controller from the others). This loop tries for it every interval;
the schedule and retention loops only read what its last look found (``duty.leading``),
so no replica opens a connection for it more often than once an interval, and no loop
takes it its own way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from lakeshore.store.leadership import Duty

log = logging.getLogger("lakeshore.leadership")


async def run_forever(
    duty: Duty,
    interval_s: float,
    *,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Try for (or keep) ``duty`` every ``interval_s``, the first look one interval after
    the start, until cancelled (``sleep`` waits between two looks: tests give one that
    takes no time)."""
    leading = False
    while True:
        await sleep(interval_s)
        try:
            held = await duty.try_lead()
        except Exception:
            log.exception("looking for the housekeeping lead failed; the next look is on time")
        else:
            if held != leading:
                leading = held
                log.info(
                    "this server %s the cluster's housekeeping",
                    "does" if leading else "no longer does",
                )
