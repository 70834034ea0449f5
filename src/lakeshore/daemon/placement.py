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
from typing import Literal, NamedTuple, Protocol

Kind = Literal["plain", "async"]
MIB = 1024 * 1024


class Placeable(Protocol):
    """What placement reads of a live child: a :class:`ChildView`, or the pool's own
    record of the child, read as it stands (nothing is built for a placement)."""

    @property
    def running(self) -> int: ...  # invocations it runs now

    @property
    def all_async(self) -> bool: ...  # every one of them is async (true when idle)

    @property
    def seen(self) -> Set[str]: ...  # functions it has run

    @property
    def retiring(self) -> bool: ...


class ChildView(NamedTuple):
    """A child as placement sees it, written out (the tests' children)."""

    running: int
    all_async: bool
    seen: Set[str]
    retiring: bool = False


def choose(
    children: Sequence[Placeable], fn: str, kind: Kind | None, async_concurrency: int
) -> int | None:
    """The index of the child that takes an invocation of ``fn``; None to start a new one.

    ``kind`` is None while no child has told whether ``fn`` is async. Of the children
    that can take it: one that has run ``fn`` first, then the busiest, then the first in
    order. ``all_async`` is read only of a busy child an async invocation could join."""
    best: int | None = None
    best_key = (True, 0)
    for index, child in enumerate(children):
        if child.retiring:
            continue
        running = child.running
        if running and not (kind == "async" and running < async_concurrency and child.all_async):
            continue
        key = (fn not in child.seen, -running)
        if best is None or key < best_key:
            best, best_key = index, key
            if kind != "async" and not key[0]:
                break  # an idle child that ran it: none later comes first
    return best


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
