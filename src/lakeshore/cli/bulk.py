"""``lakeshore submit QUEUE FN --from-file calls.jsonl``: many calls of one function, in
batches.

Each line of the file is one call: a JSON object with any of ``args`` (a list),
``kwargs`` (an object), ``key`` (an idempotency key), ``delay_s`` (seconds, at least 0),
``not_before`` (an RFC 3339 time), ``max_attempts`` and ``timeout_s``; blank lines are
skipped. The whole file is read and checked first: a bad line is reported with its
number and nothing is submitted. The calls then go in batches of :data:`BATCH` (one
request each, ``POST …/invocations/batch``, which stores a batch whole or not at all),
with a progress bar; a batch the server refuses stops the run, and the summary says how
many went in before it (a rerun with keys on every line submits each call once).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from lakeshore import jsontext

BATCH: Final = 1_000  # the most calls a batch request takes
FIELDS: Final = ("args", "kwargs", "key", "delay_s", "not_before", "max_attempts", "timeout_s")
MAX_SHOWN: Final = 20  # bad lines listed; the rest are counted


@dataclass(frozen=True)
class Call:
    line: int  # its line in the file, from 1
    body: dict[str, Any]  # the submit's body, without fn


def _problem(value: Any) -> str | None:
    """Why a line's value is not a call, or None."""
    if type(value) is not dict:
        return "not a JSON object"
    unknown = sorted(set(value) - set(FIELDS))
    if unknown:
        return f"unknown field {unknown[0]!r} (known: {', '.join(FIELDS)})"
    checks: list[tuple[str, Callable[[Any], bool], str]] = [
        ("args", lambda v: type(v) is list, "a list"),
        ("kwargs", lambda v: type(v) is dict, "an object"),
        ("key", lambda v: type(v) is str, "a string"),
        ("not_before", lambda v: type(v) is str, "an RFC 3339 time, as a string"),
        ("delay_s", lambda v: type(v) in (int, float) and v >= 0, "a number of seconds >= 0"),
        ("max_attempts", lambda v: type(v) is int and v >= 1, "an integer >= 1"),
        ("timeout_s", lambda v: type(v) in (int, float) and v > 0, "a number of seconds > 0"),
    ]
    for name, ok, wanted in checks:
        if name in value and not ok(value[name]):
            return f"{name} must be {wanted}"
    if "delay_s" in value and "not_before" in value:
        return "give delay_s or not_before, not both"
    return None


def read(lines: Iterable[str]) -> tuple[list[Call], list[str]]:
    """The calls of a file's lines, and what is wrong with the bad ones (``line N: …``)."""
    calls: list[Call] = []
    bad: list[str] = []
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            value = jsontext.parsed(text.encode())
        except (ValueError, RecursionError) as exc:
            bad.append(f"line {number}: not JSON ({str(exc).split(';')[0]})")
            continue
        problem = _problem(value)
        if problem is not None:
            bad.append(f"line {number}: {problem}")
        else:
            calls.append(Call(number, value))
    return calls, bad


def lines_of(path: str) -> list[str]:
    """The file's lines (``-``: standard input)."""
    if path == "-":
        return sys.stdin.read().splitlines()
    return Path(path).read_text(encoding="utf-8").splitlines()


def batches(calls: Sequence[Call], size: int = BATCH) -> list[Sequence[Call]]:
    return [calls[i : i + size] for i in range(0, len(calls), size)]


def shown(bad: Sequence[str]) -> str:
    """The bad lines, at most :data:`MAX_SHOWN` of them, and how many more."""
    lines = list(bad[:MAX_SHOWN])
    if len(bad) > MAX_SHOWN:
        lines.append(f"… and {len(bad) - MAX_SHOWN} more bad lines")
    return "\n".join(lines)


def progress(total: int) -> Progress:
    """A bar on standard error (left out where it is not a terminal)."""
    bar = Progress(
        TextColumn("submitting"),
        BarColumn(),
        MofNCompleteColumn(),
        transient=True,
        disable=not sys.stderr.isatty(),
    )
    bar.add_task("submit", total=total)
    return bar
