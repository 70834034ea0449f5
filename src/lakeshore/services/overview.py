"""What the dashboard shows of every queue at once, read once per interval for every open
page (not once per page): each queue's counts, daemons and launches in flight, and its
scope's latest decision; and, while the dashboard is in use, a short time series of each
queue's pending, running and daemons, sampled from those same reads.

The series is this replica's memory (lost when it restarts, empty before the dashboard
was first opened): the decision feed records daemon counts at every decision, but not
the running count, and a chart that mixes sources would disagree with itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import RowMapping

from lakeshore.store import events as event_store
from lakeshore.store import gauges
from lakeshore.store.engine import Store
from lakeshore.store.gauges import QueueGauges

log = logging.getLogger("lakeshore.overview")

INTERVAL_S = 2.0  # a read is shared by every page asking within this long
SAMPLE_S = 5.0  # the series' step while the dashboard is in use
IDLE_S = 600.0  # no page asked for this long: sampling stops
POINTS = 360  # per queue: 30 minutes at SAMPLE_S
SERIES_QUEUES = 2_000  # queues with a series at most (the first by namespace and name)


@dataclass(frozen=True)
class Point:
    at: datetime
    pending: int
    running: int
    daemons: int


@dataclass(frozen=True)
class Snapshot:
    taken_at: datetime
    queues: dict[tuple[str, str], QueueGauges]  # by (namespace id, queue name)
    latest: dict[tuple[str, str], RowMapping]  # newest event by (namespace id, scope)

    def of(self, namespace_id: str, queue: str) -> QueueGauges | None:
        return self.queues.get((namespace_id, queue))

    def decision(self, namespace_id: str, queue: str) -> RowMapping | None:
        found = self.of(namespace_id, queue)
        return self.latest.get((namespace_id, found.scope if found else queue))


@dataclass
class Overview:
    """The shared read and the series. ``clock`` gives the store's time (the app's),
    ``timer`` the monotonic time the interval is measured in."""

    store: Store
    clock: Callable[[], datetime]
    timer: Callable[[], float] = time.monotonic
    interval_s: float = INTERVAL_S
    sample_s: float = SAMPLE_S
    series: dict[tuple[str, str], deque[Point]] = field(default_factory=dict)
    reads: int = 0  # how many times the store was read (for tests and the curious)
    _last: Snapshot | None = None
    _last_read: float = float("-inf")
    _last_used: float = float("-inf")
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _sampler: asyncio.Task[None] | None = None

    async def current(self) -> Snapshot:
        """The latest read, taken now if older than the interval (one read at a time: a
        page that asks while another read runs waits for it)."""
        self._last_used = self.timer()
        self._start_sampling()
        async with self._lock:
            if self._last is None or self.timer() - self._last_read >= self.interval_s:
                await self._read()
            assert self._last is not None
            return self._last

    async def _read(self) -> None:
        now = self.clock()
        async with self.store.read() as conn:
            found = await gauges.read(conn, now)
            latest = await event_store.latest_everywhere(conn)
        self.reads += 1
        self._last = Snapshot(now, {(g.namespace_id, g.queue): g for g in found}, latest)
        self._last_read = self.timer()
        self._sample(self._last)

    def _sample(self, snapshot: Snapshot) -> None:
        for key, g in snapshot.queues.items():
            points = self.series.get(key)
            if points is None:
                if len(self.series) >= SERIES_QUEUES:
                    continue
                points = self.series[key] = deque(maxlen=POINTS)
            if points and (snapshot.taken_at - points[-1].at).total_seconds() < self.sample_s:
                continue
            points.append(Point(snapshot.taken_at, g.pending, g.running, g.daemons))

    def points(self, namespace_id: str, queue: str) -> list[dict[str, Any]]:
        return [
            {
                "at": p.at.isoformat(),
                "pending": p.pending,
                "running": p.running,
                "daemons": p.daemons,
            }
            for p in self.series.get((namespace_id, queue), ())
        ]

    def _start_sampling(self) -> None:
        if self._sampler is None or self._sampler.done():
            self._sampler = asyncio.create_task(self._sample_while_used(), name="lakeshore-ui")

    async def _sample_while_used(self) -> None:
        while self.timer() - self._last_used < IDLE_S:
            await asyncio.sleep(self.sample_s)
            try:
                async with self._lock:
                    if self.timer() - self._last_read >= self.sample_s:
                        await self._read()
            except Exception:
                log.exception("dashboard sample failed")
        self.series.clear()  # nobody looked for IDLE_S: start afresh next time

    async def close(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
