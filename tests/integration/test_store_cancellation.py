"""A write cancelled just as SQLite's in-process writer lock frees is cancelled, not let
in: Python 3.11's ``asyncio.wait_for`` returned the lock instead, the caller ran on with a
cancellation it never saw, and the daemon waiting for that caller hung at exit (the
suite's intermittent hang). The lock exists on SQLite only (PostgreSQL has row locks)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from lakeshore.store.engine import Store, create_engine_for, parse_url


@pytest.mark.parametrize("steps_before_cancel", [0, 1, 2, 3])
async def test_a_writer_cancelled_as_the_lock_frees_ends_cancelled(
    tmp_path: Path, steps_before_cancel: int
) -> None:
    store = Store(create_engine_for(parse_url(f"sqlite:///{tmp_path / 'lakeshore.db'}")))
    entered: list[bool] = []

    async def writer() -> None:
        async with store._one_writer():
            entered.append(True)
            await asyncio.Event().wait()

    try:
        async with store._one_writer():  # held: the writer queues behind it
            task = asyncio.create_task(writer())
            await asyncio.sleep(0)
        for _ in range(steps_before_cancel):  # each ordering of release and cancel
            await asyncio.sleep(0)
        task.cancel()
        await asyncio.wait({task}, timeout=5)
        assert task.cancelled(), f"entered the lock: {entered}"
        async with asyncio.timeout(5), store._one_writer():
            pass  # and the lock is free again
    finally:
        await store.close()
