"""Readiness' write probe: one write every few seconds however many ask, the last verdict
kept while the writer is busy, and what a refused write says (a real SQLite made full)."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest
from sqlalchemy.exc import OperationalError

from lakeshore.api.routes.health import OK, WriteProbe, refusal


class Writes:
    """The probe's write, counted; it fails with ``error`` when one is set, and waits
    for ``gate`` when it is closed."""

    def __init__(self) -> None:
        self.count = 0
        self.error: Exception | None = None
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self) -> None:
        self.count += 1
        await self.gate.wait()
        if self.error is not None:
            raise self.error


class Seconds:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def full_disk() -> OperationalError:
    """The error a write gets from a SQLite that cannot grow (as on a full disk)."""
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t (x)")
    db.execute(f"PRAGMA max_page_count = {db.execute('PRAGMA page_count').fetchone()[0]}")
    try:
        db.execute("INSERT INTO t VALUES (zeroblob(100000))")
    except sqlite3.OperationalError as exc:
        return OperationalError("INSERT", {}, exc)
    finally:
        db.close()
    raise AssertionError("the store was not full")


async def test_a_verdict_is_kept_its_few_seconds_then_asked_again() -> None:
    writes, seconds = Writes(), Seconds()
    probe = WriteProbe(writes, seconds, ttl_s=5.0)

    first = await probe.verdict()
    writes.error = full_disk()
    seconds.now += 4.9
    kept = await probe.verdict()
    seconds.now += 0.1
    asked = await probe.verdict()
    seconds.now -= 60  # a clock set back asks again rather than keep it a minute
    writes.error = None
    back = await probe.verdict()

    assert (first, kept, asked, back) == (OK, OK, "not writable: the disk is full", OK)
    assert writes.count == 3


async def test_callers_at_once_share_one_write() -> None:
    writes = Writes()
    writes.gate.clear()
    probe = WriteProbe(writes, Seconds(), wait_s=60.0)

    waiting = [asyncio.create_task(probe.verdict()) for _ in range(20)]
    await asyncio.sleep(0)  # all of them asking while the write is under way
    writes.gate.set()

    assert await asyncio.gather(*waiting) == [OK] * 20
    assert writes.count == 1


async def test_a_probe_that_waits_on_a_busy_writer_leaves_the_last_verdict() -> None:
    writes, seconds = Writes(), Seconds()
    probe = WriteProbe(writes, seconds, ttl_s=5.0, wait_s=0.0)
    writes.error = full_disk()
    writes.gate.clear()

    busy = await probe.verdict()  # the server started writable: that stands
    writes.gate.set()
    await asyncio.sleep(0)  # the probe's write ends by itself, answered or not
    await asyncio.sleep(0)
    seconds.now += 1
    known = await probe.verdict()

    assert (busy, known) == (OK, "not writable: the disk is full")
    assert writes.count == 1


@pytest.mark.parametrize(
    ("errorname", "sqlstate", "said"),
    [
        ("SQLITE_FULL", None, "not writable: the disk is full"),
        (None, "53100", "not writable: the disk is full"),
        ("SQLITE_READONLY_DIRECTORY", None, "not writable: the store is read-only"),
        (None, "25006", "not writable: the store is read-only"),
        ("SQLITE_IOERR_WRITE", None, "not writable: I/O error"),
        (None, "53200", "not writable: the database server is out of resources"),
        (None, "42501", "not writable (42501)"),
        ("SQLITE_BUSY", None, None),  # busy says nothing about the disk
        (None, "55P03", None),
    ],
)
def test_a_refused_write_says_why_without_the_drivers_message(
    errorname: str | None, sqlstate: str | None, said: str | None
) -> None:
    class Refused(Exception):
        pass

    orig = Refused('could not extend file "base/16384/t3_1": No space left on device')
    orig.sqlite_errorname = errorname  # type: ignore[attr-defined]
    orig.sqlstate = sqlstate  # type: ignore[attr-defined]

    assert refusal(OperationalError("stmt", {}, orig)) == said
