"""Functions the tests run as invocations (imported by daemons by path)."""

from __future__ import annotations

import os
import time
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


class Unusual(Exception):
    pass


@udf(queue="sdk", max_attempts=1)
def unusual() -> None:
    raise Unusual("very")
