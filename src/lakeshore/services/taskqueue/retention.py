"""The retention sweep: finished invocations, their stream items and decision events
deleted once past their window, by the leading server only.

Which rows are past their window is decided in :mod:`lakeshore.domain.retention` (pure,
given ``now``); the SQL is :mod:`lakeshore.store.retention`. Here the sweep runs it one
batch (at most :data:`~lakeshore.domain.retention.BATCH_ROWS` rows) per transaction,
each followed by a pause four times as long, so that a claim or a submit waits at most
for one short batch, never for the backlog; a
backlog larger than a sweep's batches is finished by the next sweeps. A failed batch is
logged and the sweep goes on with the next queue or kind.

The loop sweeps only where this server does the cluster's housekeeping (a PostgreSQL
advisory lock of its own, :func:`lakeshore.store.leadership.housekeeping`, or the only
server on SQLite), so replicas never delete the same rows twice over. It reads the lead;
:mod:`.leading`'s loop takes it. It also holds the one home of event pruning: the
controller writes decision events, this sweep deletes them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime

from lakeshore.domain import retention
from lakeshore.services.metrics import Metrics
from lakeshore.store import retention as retention_store
from lakeshore.store import tallies
from lakeshore.store.engine import Store
from lakeshore.store.leadership import Duty

log = logging.getLogger("lakeshore.retention")

Clock = Callable[[], datetime]


@dataclass(frozen=True)
class Windows:
    """The server's windows, in seconds (a queue's ``retention_s`` wins over the first)."""

    retention_s: float = retention.DEFAULT_RETENTION_S
    event_retention_s: float = retention.DEFAULT_EVENT_RETENTION_S
    noop_retention_s: float = retention.DEFAULT_EVENT_RETENTION_S


async def sweep(
    store: Store,
    now: datetime,
    windows: Windows,
    metrics: Metrics | None = None,
    *,
    batch_rows: int = retention.BATCH_ROWS,
    max_batches: int = retention.MAX_BATCHES,
) -> retention.Deleted:
    """One sweep: what it deleted, by kind (also counted in ``metrics``)."""
    invocations = items = events = 0
    async with store.read() as conn:
        windows_of = await retention_store.queue_windows(conn)
    cutoffs = retention.queue_cutoffs(now, windows_of, windows.retention_s)
    for queue_id, cutoff in cutoffs.items():
        # the finished rows counted for stats first (a deleted row comes off the tally
        # if it was in it), then the rows past the window deleted
        try:
            async with store.write() as conn:
                await tallies.roll_up(conn, queue_id, retention.tally_until(now))
        except Exception:
            log.exception("retention: tallying queue %s failed; the sweep goes on", queue_id)
        before = cutoff

        async def finished(queue_id: str = queue_id, before: datetime = before) -> int:
            nonlocal invocations, items
            async with store.write() as conn:
                gone, gone_items = await retention_store.delete_finished(
                    conn, queue_id, before, limit=batch_rows
                )
            invocations += gone
            items += gone_items
            if metrics is not None:
                metrics.count_retention(invocations=gone, stream_items=gone_items)
            return gone

        await _batches(f"invocations of queue {queue_id}", finished, batch_rows, max_batches)

    every, noops = retention.event_cutoffs(now, windows.event_retention_s, windows.noop_retention_s)
    for before, noops_only in ((noops, True), (every, False)):

        async def old_events(before: datetime = before, noops_only: bool = noops_only) -> int:
            nonlocal events
            async with store.write() as conn:
                gone = await retention_store.delete_events(
                    conn, before, limit=batch_rows, noops_only=noops_only
                )
            events += gone
            if metrics is not None:
                metrics.count_retention(events=gone)
            return gone

        await _batches("decision events", old_events, batch_rows, max_batches)
    if invocations or events:
        await _vacuum_where_the_database_does_not(store)
    return retention.Deleted(invocations=invocations, stream_items=items, events=events)


async def _vacuum_where_the_database_does_not(store: Store) -> None:
    """With PostgreSQL's ``autovacuum`` off, a deleted row's room is never used again and
    the table grows however much is deleted (``bench/steady_retention.py``): after a
    sweep that deleted, the sweep vacuums the tables it and the live path churn."""
    try:
        async with store.engine.connect() as conn:
            if await retention_store.vacuumed_by_the_server(conn):
                return
            await conn.commit()  # out of the transaction SHOW began
            done = await conn.execution_options(isolation_level="AUTOCOMMIT")
            await retention_store.vacuum(done)
    except Exception:
        log.exception("retention: vacuuming after the sweep failed; the next sweep tries again")


async def _batches(
    what: str, batch: Callable[[], Awaitable[int]], batch_rows: int, max_batches: int
) -> None:
    loop = asyncio.get_running_loop()
    done, last = 0, batch_rows
    while retention.more_batches(last, done, batch_rows=batch_rows, max_batches=max_batches):
        began = loop.time()
        try:
            last = await batch()
        except Exception:
            log.exception("retention: deleting %s failed; the sweep goes on", what)
            return
        done += 1
        if retention.more_batches(last, done, batch_rows=batch_rows, max_batches=max_batches):
            # the store is the live path's between two batches (see retention.PAUSE_SHARE)
            await asyncio.sleep(retention.pause_after(loop.time() - began))


async def run_forever(
    store: Store,
    duty: Duty,
    clock: Clock,
    interval_s: float,
    windows: Windows,
    metrics: Metrics | None = None,
    *,
    working: asyncio.Lock | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Sweep every ``interval_s`` while this server does the cluster's housekeeping
    (``duty``), until cancelled.
    ``working`` is held through each sweep (see ``lakeshore.api.app``); ``sleep`` waits
    between sweeps (tests give one that takes no time)."""
    working = working or asyncio.Lock()
    while True:
        await sleep(interval_s)
        try:
            async with working:
                if not duty.leading:  # taken by .leading's loop
                    continue
                deleted = await sweep(store, clock(), windows, metrics)
        except Exception:
            log.exception("retention sweep failed; the next one runs on schedule")
            continue
        if any(deleted.as_counts().values()):
            log.info("retention: deleted %s", deleted.as_counts())
