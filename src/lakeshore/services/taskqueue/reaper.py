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

from lakeshore.services.metrics import Metrics
from lakeshore.services.taskqueue.invocations import stream_key
from lakeshore.services.taskqueue.notify import Notifier
from lakeshore.store import invocations as inv_store
from lakeshore.store import leases as lease_store
from lakeshore.store import wakeups
from lakeshore.store import workers as worker_store
from lakeshore.store.engine import Store

log = logging.getLogger("lakeshore.reaper")

WORKER_TTL_S = 60.0  # a worker not heard from for this long is dropped


async def reap(
    store: Store,
    now: datetime,
    metrics: Metrics | None = None,
    notifier: Notifier | None = None,
) -> dict[str, int]:
    """One sweep; the counts of what each step did (a failed step counts 0, and is logged),
    and, with ``metrics``, its outcomes counted per queue.

    The queues that got work back wake their waiting claims (``notifier`` on this server,
    a notification on PostgreSQL for the others): work handed back unbegun is due at once,
    and a retry's claim learns when its backoff ends.
    """
    counts = {"retried": 0, "failed": 0, "returned": 0, "expired": 0, "workers_dropped": 0}
    outcomes: dict[tuple[str, str], int] = {}
    taken_back: dict[str, int] = {}
    woken: set[str] = set()

    async def leases(conn: AsyncConnection) -> None:
        reaped = await lease_store.reap_expired(conn, now)
        counts.update(reaped.counts)
        counts["returned"] = sum(reaped.returned.values())
        outcomes.update(reaped.by_queue)
        taken_back.update(_taken_back(reaped.by_queue, reaped.returned))
        woken.update(q for q, outcome in reaped.by_queue if outcome == "retried")
        woken.update(reaped.returned)
        await wakeups.publish(conn, sorted(woken))

    async def deadlines(conn: AsyncConnection) -> None:
        expired = await inv_store.expire_all_overdue(conn, now)
        await wakeups.publish(conn, [stream_key(i) for i, _ in expired])
        counts["expired"] = len(expired)
        for _, queue_id in expired:
            outcomes[(queue_id, "expired")] = outcomes.get((queue_id, "expired"), 0) + 1

    async def silent(conn: AsyncConnection) -> None:
        gone = await worker_store.drop_silent(conn, now - timedelta(seconds=WORKER_TTL_S))
        counts["workers_dropped"] = len(gone)

    for name, step in (("leases", leases), ("deadlines", deadlines), ("workers", silent)):
        await _alone(store, name, step)
    if notifier is not None and woken:
        notifier.notify(sorted(woken))
    if metrics is not None:
        await _alone_read(lambda: metrics.count_by_queue(store, outcomes, taken_back))
    return counts


def _taken_back(charged: dict[tuple[str, str], int], returned: dict[str, int]) -> dict[str, int]:
    """Leases taken back, by queue: those charged (retried or failed) and those returned
    uncharged (never begun)."""
    back = dict(returned)
    for (queue_id, _), n in charged.items():
        back[queue_id] = back.get(queue_id, 0) + n
    return back


async def _alone_read(count: Callable[[], Awaitable[None]]) -> None:
    try:
        await count()
    except Exception:
        log.exception("reaper could not count its sweep in the metrics")


async def _alone(
    store: Store, name: str, step: Callable[[AsyncConnection], Awaitable[Any]]
) -> None:
    try:
        async with store.write() as conn:
            await step(conn)
    except Exception:
        log.exception("reaper step %s failed; the other steps ran", name, extra={"step": name})
