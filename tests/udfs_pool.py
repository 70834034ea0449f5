"""Functions the warm-pool tests run (imported by pool children by path): warm state,
set-up hooks, crashes, and ``async def``."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from lakeshore import udf

SEEN: list[int] = []  # warm state: what earlier invocations in this child left here
SETUPS = 0  # how many times the set-up hook ran in this child
SETUP_CALLS = 0  # including the ones that raised


def remember(value: int) -> dict[str, Any]:
    """Keep ``value`` in this child's memory; answer everything kept so far."""
    SEEN.append(value)
    return {"pid": os.getpid(), "seen": list(SEEN)}


def pid() -> int:
    return os.getpid()


def load_model() -> None:
    global SETUPS, SETUP_CALLS
    SETUP_CALLS += 1
    SETUPS += 1


@udf(queue="pool", setup=load_model)
def predict(x: int) -> dict[str, int]:
    return {"pid": os.getpid(), "setups": SETUPS, "y": 2 * x}


@udf(queue="pool", setup=load_model)
async def predict_async(x: int) -> dict[str, int]:
    await asyncio.sleep(0)
    return {"pid": os.getpid(), "setups": SETUPS, "y": 2 * x}


FLAKY_CALLS = 0


def flaky_setup() -> None:
    """Raises the first time in each child, then works."""
    global FLAKY_CALLS
    FLAKY_CALLS += 1
    if FLAKY_CALLS == 1:
        raise RuntimeError("the GPU is not ready yet")


@udf(queue="pool", setup=flaky_setup)
def after_flaky_setup() -> dict[str, int]:
    return {"pid": os.getpid(), "setup_calls": FLAKY_CALLS}


def crash_once(marker: str) -> int:
    """Abort the child the first time (leaving ``marker``), succeed on the next attempt."""
    path = Path(marker)
    if not path.exists():
        path.write_text("crashed once\n", encoding="utf-8")
        os.abort()
    return os.getpid()


def abort() -> None:
    os.abort()


def wait_for_file(gate: str) -> int:
    """Wait (at most 60 s) until ``gate`` exists; the child's pid."""
    deadline = time.monotonic() + 60
    while not Path(gate).exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return os.getpid()


def preloaded() -> bool | None:
    """Whether ``tests.udfs_preloaded`` was imported in this child before this call (None:
    not imported at all)."""
    module = sys.modules.get("tests.udfs_preloaded")
    return None if module is None else bool(os.getpid() == module.IMPORTED_BY)


# --- async def ---------------------------------------------------------------------------


async def async_square(x: int) -> int:
    await asyncio.sleep(0)
    return x * x


async def async_count(n: int) -> AsyncIterator[int]:
    for i in range(n):
        await asyncio.sleep(0)
        yield i


async def async_gated(gate: str) -> AsyncIterator[int]:
    """Yield 0, wait (at most 60 s) until ``gate`` exists, then yield 1."""
    yield 0
    deadline = time.monotonic() + 60
    # another process makes the file: there is no event to wait on
    while not await asyncio.to_thread(Path(gate).exists) and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.02)
    yield 1


async def async_sleep(seconds: float) -> float:
    await asyncio.sleep(seconds)
    return seconds


async def async_pid_then_sleep(path: str, seconds: float) -> None:
    await asyncio.to_thread(Path(path).write_text, str(os.getpid()), encoding="utf-8")
    await asyncio.sleep(seconds)


async def async_boom() -> None:
    raise ValueError("async boom")


async def async_not_json() -> object:
    return object()


_ARRIVED: dict[str, list[asyncio.Event]] = {}


async def together(group: str, n: int) -> int:
    """Wait (at most 30 s) until ``n`` invocations of ``group`` are running in this child at
    once; the child's pid. Only a child that runs them concurrently gets there."""
    arrived = _ARRIVED.setdefault(group, [])
    mine = asyncio.Event()
    arrived.append(mine)
    if len(arrived) >= n:
        for event in arrived:
            event.set()
    async with asyncio.timeout(30):
        await mine.wait()
    return os.getpid()


async def blocks_its_loop(seconds: float) -> int:
    """An async UDF that never gives way: it blocks its event loop."""
    time.sleep(seconds)  # noqa: ASYNC251  (the point of it)
    return os.getpid()
