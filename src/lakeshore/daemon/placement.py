"""Which pool child takes an invocation, and when a child is recycled: pure decisions.

A child runs one plain (or generator) invocation at a time, or up to ``async_concurrency``
``async def`` ones together on its event loop. Whether a function is async is learnt from
the child that first imports it (``fn_kind``): until then it is treated as plain, so it
gets a child to itself. Among the children that can take an invocation, one that already
ran the function comes first (its module and warm state are there), then the busiest (so
async work packs into few children and idle ones stay free for plain work).

A child is recycled after the invocation that takes it to ``max_invocations``, or leaves
its resident memory above ``max_memory_mb`` — Celery's ``max_tasks_per_child`` and
``max_memory_per_child``.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from typing import Literal, NamedTuple

Kind = Literal["plain", "async"]
MIB = 1024 * 1024


class ChildView(NamedTuple):
    """What placement needs to know of a live child (made for each child at each
    placement: a tuple, the cheapest to build)."""

    running: int  # invocations it runs now
    all_async: bool  # every one of them is async (vacuously true when idle)
    seen: Set[str]  # functions it has run (the child's own set: read, never changed)
    retiring: bool = False


def choose(
    children: Sequence[ChildView], fn: str, kind: Kind | None, async_concurrency: int
) -> int | None:
    """The index of the child that takes an invocation of ``fn``; None to start a new one.

    ``kind`` is None while no child has told whether ``fn`` is async."""
    fits = [
        index
        for index, child in enumerate(children)
        if not child.retiring
        and (
            child.running == 0
            or (kind == "async" and child.all_async and child.running < async_concurrency)
        )
    ]
    if not fits:
        return None
    return min(fits, key=lambda i: (fn not in children[i].seen, -children[i].running, i))


def recycle(
    invocations: int,
    rss_bytes: int,
    *,
    max_invocations: int | None,
    max_memory_mb: float | None,
) -> bool:
    """Whether a child that has run ``invocations`` and holds ``rss_bytes`` is replaced."""
    if max_invocations is not None and invocations >= max_invocations:
        return True
    return max_memory_mb is not None and rss_bytes > max_memory_mb * MIB
