"""The server's clock on PostgreSQL is the database's: the wall clock corrected by its
measured offset; a large offset is a warning, and an offset that cannot be measured
stops the reaper (see ``lakeshore.store.dbclock``)."""

from __future__ import annotations

import asyncio
import logging
import socket
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import text

from lakeshore.api.app import _reap_forever
from lakeshore.store import dbclock
from lakeshore.store.engine import Store, create_engine_for, parse_url
from tests.conftest import FakeClock

AHEAD = timedelta(seconds=40)


def _closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _ahead() -> datetime:
    return datetime.now(UTC) + AHEAD


async def _database_now(store: Store) -> datetime:
    async with store.read() as conn:
        value: datetime = (await conn.execute(text("SELECT clock_timestamp()"))).scalar_one()
    return value


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_a_clock_ahead_is_corrected_to_the_databases_and_said_loudly(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    clock = dbclock.DatabaseClock(store, wall=_ahead)
    with caplog.at_level(logging.WARNING, logger="lakeshore.clock"):
        assert await clock.check()
        assert await clock.check()  # the same offset again: not logged twice
    assert abs(clock.offset + AHEAD) < timedelta(seconds=1)
    assert abs(clock() - await _database_now(store)) < timedelta(seconds=1)
    [warning] = [r.getMessage() for r in caplog.records]
    assert warning.startswith("this server's clock is 40.0"), warning
    assert "s ahead of the database's" in warning


async def test_no_sweep_runs_on_a_clock_that_cannot_be_measured(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Nothing answers at the database's address: the check fails, the clock keeps its
    last offset, and the reaper's loop sweeps nothing (a sweep would fail loudly)."""
    url = parse_url(f"postgresql://postgres@127.0.0.1:{_closed_port()}/none")
    store = Store(create_engine_for(url))
    try:
        clock = dbclock.DatabaseClock(store)
        with caplog.at_level(logging.INFO):
            assert not await clock.check()
            assert clock.offset == timedelta(0)
            loop = _reap_forever(store, clock, 0.01)
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.3):
                    await loop
    finally:
        await store.close()
    messages = [r.getMessage() for r in caplog.records]
    assert any("reaping waits for it" in m for m in messages), messages
    assert not any("sweep failed" in m or "step" in m for m in messages), messages


async def test_sqlite_and_a_given_clock_are_taken_as_they_are(tmp_path: Path) -> None:
    store = Store(create_engine_for(parse_url(f"sqlite:///{tmp_path / 'l.db'}")))
    try:
        given = FakeClock()
        assert (await dbclock.for_server(store, given))() == given.now
        wall = await dbclock.for_server(store, None)
        assert await wall.check()
        assert abs(wall() - datetime.now(UTC)) < timedelta(seconds=1)
    finally:
        await store.close()
