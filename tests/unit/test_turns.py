"""Fair turns between concurrency keys (``store.invocations.in_turns``), as a table: the
order a claim hands its rows out in, the same rule its statement ranks them by."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from lakeshore.store.invocations import in_turns

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def rows(spec: str) -> list[dict[str, Any]]:
    """``"a a b -"``: one row per word, submitted in that order, each its key ('-': none);
    ``a:5`` gives priority 5. Each row's id is its key and its place."""
    made = []
    for n, word in enumerate(spec.split()):
        key, _, priority = word.partition(":")
        made.append(
            {
                "id": f"{key}{n}",
                "concurrency_key": None if key == "-" else key,
                "priority": float(priority or 0),
                "created_at": T0 + timedelta(seconds=n),
            }
        )
    return made


CASES = [
    ("fifo", "a a a b", "a0 b3 a1 a2"),
    ("fifo", "a a a b b", "a0 b3 a1 b4 a2"),
    ("fifo", "a a - b", "a0 -2 b3 a1"),  # rows without a key: one key of their own
    ("fifo", "a b c a b c", "a0 b1 c2 a3 b4 c5"),
    ("fifo", "- - -", "-0 -1 -2"),  # no keys: the queue's own order
    ("filo", "a a a b", "b3 a2 a1 a0"),
    ("filo", "a b a b", "b3 a2 b1 a0"),
    ("priority", "a:1 a:5 a:5 b:5", "a1 b3 a2 a0"),  # turns within one priority
    ("priority", "a a b:9", "b2 a0 a1"),
]


@pytest.mark.parametrize(("kind", "given", "expected"), CASES)
def test_turns(kind: str, given: str, expected: str) -> None:
    assert [r["id"] for r in in_turns(kind, rows(given))] == expected.split()  # type: ignore[arg-type]
