"""Functions the tests run as invocations (imported by daemons by path)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lakeshore import udf


def echo(*args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"args": list(args), "kwargs": kwargs}


def square(x: int) -> int:
    return x * x


def noop() -> None:
    return None


def boom(message: str = "boom") -> None:
    raise ValueError(message)


def not_json() -> object:
    return object()


def crash() -> None:
    os._exit(3)


def sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def record(path: str, value: int, seconds: float = 0.0) -> int:
    """Append ``value`` to ``path`` (one line per execution), then return it."""
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(f"{value}\n")
    time.sleep(seconds)
    return value


@udf(queue="sdk", max_attempts=1)
def cube(x: int) -> int:
    return x * x * x


@udf(queue="sdk", max_attempts=1)
def divide(a: float, b: float) -> float:
    return a / b


# retried at once on any error but ZeroDivisionError, which fails it at its first attempt
@udf(queue="sdk", retry={"max_attempts": 3, "base_s": 0.0, "never": ["ZeroDivisionError"]})
def careful_divide(a: float, b: float) -> float:
    return a / b


class Unusual(Exception):
    pass


@udf(queue="sdk", max_attempts=1)
def unusual() -> None:
    raise Unusual("very")


# --- generators: streamed item by item --------------------------------------------------


def count(n: int) -> Iterator[int]:
    """Yield 0 … n-1; the result is n."""
    yield from range(n)
    return n


def gated(n: int, gate: str) -> Iterator[int]:
    """Yield 0, wait (at most 60 s) until the file ``gate`` exists, then yield 1 … n-1."""
    yield 0
    deadline = time.monotonic() + 60
    while not Path(gate).exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    yield from range(1, n)
    return "done"


def fails_midway() -> Iterator[str]:
    yield "a"
    yield "b"
    raise ValueError("midway")


def bad_item() -> Iterator[Any]:
    yield 1
    yield object()


def big_item(size: int) -> Iterator[str]:
    yield "small"
    yield "x" * size


def big_result(size: int) -> str:
    return "x" * size


@udf(queue="sdk", max_attempts=1)
def words(text: str) -> Iterator[str]:
    yield from text.split()


# --- custom scalers (allowed on the test server: tests/conftest.py) --------------------


def scaler_up(signals: dict[str, Any]) -> dict[str, str]:
    return {"action": "scale_up", "reason": f"asked with pending {signals['pending']}"}


def scaler_raises(signals: dict[str, Any]) -> str:
    raise RuntimeError("scaler exploded")


def scaler_hangs(signals: dict[str, Any]) -> str:
    time.sleep(2)
    return "scale_up"


def scaler_garbage(signals: dict[str, Any]) -> object:
    return 42


def pid_then_sleep(path: str, seconds: float) -> None:
    """Write this process's id to ``path``, then sleep (a child to be killed)."""
    Path(path).write_text(str(os.getpid()), encoding="utf-8")
    time.sleep(seconds)


def environment() -> dict[str, str]:
    """This process's environment (what a UDF can read)."""
    return dict(os.environ)


def fails_until(path: str) -> str:
    """Fail (FileNotFoundError) until ``path`` exists, then return its text: a fault the
    operator mends before retrying."""
    return Path(path).read_text(encoding="utf-8")


def loaded(names: list[str]) -> dict[str, bool]:
    """Which of these modules the process running it has imported."""
    return {name: name in sys.modules for name in names}


# --- numbers past 64 bits: each must arrive and come back as the same integer ----------


@udf(queue="numbers", max_attempts=1)
def successor(x: int) -> int:
    """``x + 1``, refusing anything but an integer (a float here means it changed on the way)."""
    if type(x) is not int:
        raise TypeError(f"expected an int, got {type(x).__name__} {x!r}")
    return x + 1


@udf(queue="numbers", max_attempts=1)
def count_from(start: int, n: int) -> Iterator[int]:
    """Yield ``start`` … ``start + n - 1``; the result is the next one."""
    if type(start) is not int:
        raise TypeError(f"expected an int, got {type(start).__name__} {start!r}")
    yield from range(start, start + n)
    return start + n
