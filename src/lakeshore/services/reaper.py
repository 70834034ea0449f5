"""The reaper: expired leases back to the queue (or failed), pending work past its queue's
``deadline_cutoff_s`` expired, silent workers dropped.

Each step is its own transaction, and inside a step each group of rows is its own
savepoint: a step or a row that cannot be processed is logged with its ids and skipped,
so one namespace's odd row cannot stop lease recovery for every other namespace (a whole
sweep in one transaction rolled back on every pass once one queue's cutoff overflowed).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from lakeshore.services.invocations import stream_key
from lakeshore.store import invocations as inv_store
from lakeshore.store import leases as lease_store
from lakeshore.store import wakeups
from lakeshore.store import workers as worker_store
from lakeshore.store.engine import Store

log = logging.getLogger("lakeshore.reaper")

WORKER_TTL_S = 60.0  # a worker not heard from for this long is dropped


async def reap(store: Store, now: datetime) -> dict[str, int]:
    """One sweep; the counts of what each step did (a failed step counts 0, and is logged).

    Retried work waits out its backoff, so waiting claims find it on their next re-check.
    """
    counts = {"retried": 0, "failed": 0, "expired": 0, "workers_dropped": 0}

    async def leases(conn: AsyncConnection) -> None:
        counts.update(await lease_store.reap_expired(conn, now))

    async def deadlines(conn: AsyncConnection) -> None:
        expired = await inv_store.expire_all_overdue(conn, now)
        await wakeups.publish(conn, [stream_key(i) for i in expired])
        counts["expired"] = len(expired)

    async def silent(conn: AsyncConnection) -> None:
        gone = await worker_store.drop_silent(conn, now - timedelta(seconds=WORKER_TTL_S))
        counts["workers_dropped"] = len(gone)

    for name, step in (("leases", leases), ("deadlines", deadlines), ("workers", silent)):
        await _alone(store, name, step)
    return counts


async def _alone(
    store: Store, name: str, step: Callable[[AsyncConnection], Awaitable[Any]]
) -> None:
    try:
        async with store.write() as conn:
            await step(conn)
    except Exception:
        log.exception("reaper step %s failed; the other steps ran", name, extra={"step": name})
