"""One clock for every replica: on PostgreSQL, the server's time is the database's.

Leases, retry backoffs (``available_at``), delays and worker liveness are instants that
one replica writes and another compares (every replica reaps): a replica whose clock
ran 40 s ahead took back every lease the others granted, and at 90 s ahead dropped their
workers too. So on PostgreSQL a server's clock is its wall clock corrected by its
measured offset from the database's (``clock_timestamp()``): measured at start and again
before every reaper sweep, from the quickest of a few round trips (the database's reading
is taken to fall half-way through its round trip, so the error is at most half of it).
An offset past :data:`WARN_S` is logged as a warning that names it, and a sweep that
cannot measure it (the database did not answer, or answered too slowly to tell the time
by) reaps nothing rather than reap on a clock that may be wrong.

Why a corrected clock and not ``now()`` in every statement: every instant the server
writes or compares then stays one value the code passes down (``now``, read once at the
edge), tests can still give a clock of their own, and SQLite (one server's own store,
whose clock is the only one) needs no second way of telling the time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Protocol

from sqlalchemy import text

from lakeshore.store.engine import Store

log = logging.getLogger("lakeshore.clock")

WARN_S = 1.0  # an offset from the database's clock past this is logged as a warning
MAX_ROUND_TRIP_S = 1.0  # a reading slower than this cannot tell the time well enough
SAMPLES = 3  # round trips a measurement takes the quickest of
_NOW = text("SELECT clock_timestamp()")


def wall_clock() -> datetime:
    return datetime.now(UTC)


class ServerClock(Protocol):
    """The time a server writes and compares, and a way to check it against the
    store's before acting on it across replicas (the reaper)."""

    def __call__(self) -> datetime: ...

    async def check(self) -> bool:
        """Whether the clock is known right now; a clock that can drift is re-measured."""
        ...


class Given:
    """A clock taken as it is: SQLite's (the server's own is the store's), or one a
    test gives."""

    def __init__(self, clock: Callable[[], datetime]) -> None:
        self.clock = clock

    def __call__(self) -> datetime:
        return self.clock()

    async def check(self) -> bool:
        return True


class DatabaseClock:
    """The wall clock corrected by its offset from the database's (see the module)."""

    def __init__(self, store: Store, wall: Callable[[], datetime] = wall_clock) -> None:
        self.store = store
        self.wall = wall
        self.offset = timedelta(0)  # the database's time less this machine's
        self.error = timedelta(0)  # at most this far off (half the reading's round trip)
        self._warned: timedelta | None = None  # the offset last logged as a warning

    def __call__(self) -> datetime:
        return self.wall() + self.offset

    async def check(self) -> bool:
        """Measure the offset again; False (and logged) when it could not be measured,
        the last offset kept."""
        try:
            offset, error = await self._measure()
        except Exception as exc:
            log.warning("could not read the database's clock (%s); reaping waits for it", exc)
            return False
        if error.total_seconds() > MAX_ROUND_TRIP_S / 2:
            log.warning(
                "the database's clock took %.2f s to read; reaping waits for a quicker reading",
                2 * error.total_seconds(),
            )
            return False
        self.offset, self.error = offset, error
        self._report()
        return True

    async def _measure(self) -> tuple[timedelta, timedelta]:
        best: tuple[timedelta, timedelta] | None = None
        async with self.store.read() as conn:
            for _ in range(SAMPLES):
                sent, started = self.wall(), time.monotonic()
                database: datetime = (await conn.execute(_NOW)).scalar_one()
                half = timedelta(seconds=(time.monotonic() - started) / 2)
                sample = (database - (sent + half), half)
                if best is None or sample[1] < best[1]:
                    best = sample
        assert best is not None
        return best

    def _report(self) -> None:
        """A large offset is a warning, again whenever it moves by :data:`WARN_S`."""
        seconds = self.offset.total_seconds()
        if abs(seconds) <= WARN_S:
            if self._warned is not None:
                log.info("this server's clock is back within %.0f s of the database's", WARN_S)
                self._warned = None
            return
        if self._warned is not None and abs((self.offset - self._warned).total_seconds()) < WARN_S:
            return
        self._warned = self.offset
        log.warning(
            "this server's clock is %.3f s %s the database's: leases, retries and worker "
            "liveness go by the database's time; fix this machine's time synchronization",
            abs(seconds),
            "behind" if seconds > 0 else "ahead of",
            extra={"clock_offset_s": seconds},
        )


async def for_server(store: Store, clock: Callable[[], datetime] | None) -> ServerClock:
    """The clock a server runs on: the given one (a test's) as it is; else on PostgreSQL
    the wall clock corrected by the database's, measured once before it is returned; on
    SQLite the wall clock."""
    if clock is not None:
        return Given(clock)
    if store.dialect != "postgresql":
        return Given(wall_clock)
    corrected = DatabaseClock(store)
    if not await corrected.check():
        log.warning("the server starts on its own clock until the database's can be read")
    return corrected
