"""Functions the thread-runner tests run: in the daemon's own process, on its threads."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lakeshore import udf

# the async functions the pool tests run, run here on the thread runner's loop
from tests.udfs_pool import async_count, async_sleep, async_square, together

__all__ = ["async_count", "async_sleep", "async_square", "together"]

SEEN: dict[str, list[int]] = {}  # warm state, per test (a key of its own)
SETUPS = 0


def remember(key: str, value: int) -> dict[str, Any]:
    SEEN.setdefault(key, []).append(value)
    return {"pid": os.getpid(), "seen": list(SEEN[key]), "thread": threading.get_ident()}


def load_client() -> None:
    global SETUPS
    SETUPS += 1


@udf(queue="threads", setup=load_client)
def fetch(x: int) -> dict[str, int]:
    return {"pid": os.getpid(), "setups": SETUPS, "y": x + 1}


def count(n: int) -> Iterator[int]:
    yield from range(n)


def boom() -> None:
    raise ValueError("thread boom")


def spin(seconds: float, marker: str) -> int:
    """Busy in Python code for ``seconds`` (stoppable at any instruction), then leave
    ``marker``: a marker means it was not stopped."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pass
    Path(marker).write_text("ran to its end\n", encoding="utf-8")
    return 0


def spin_ignoring_errors(seconds: float) -> str:
    """A UDF that swallows every ``Exception``: a stop must still end it."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            time.sleep(0.001)
        except Exception:
            continue
    return "not stopped"
