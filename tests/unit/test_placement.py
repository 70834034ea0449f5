"""Which pool child takes an invocation, and when a child is recycled: a table each."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lakeshore.daemon import placement
from lakeshore.daemon.placement import ChildView

IDLE = ChildView(running=0, all_async=True, seen=frozenset())
IDLE_WARM = ChildView(running=0, all_async=True, seen=frozenset({"m:f"}))
PLAIN_BUSY = ChildView(running=1, all_async=False, seen=frozenset({"m:f"}))
ASYNC_ONE = ChildView(running=1, all_async=True, seen=frozenset({"m:g"}))
ASYNC_TWO = ChildView(running=2, all_async=True, seen=frozenset({"m:g"}))
IDLE_G = ChildView(running=0, all_async=True, seen=frozenset({"m:g"}))
RETIRING = ChildView(running=0, all_async=True, seen=frozenset({"m:f"}), retiring=True)


@pytest.mark.parametrize(
    ("children", "fn", "kind", "concurrency", "expected"),
    [
        ([], "m:f", None, 1, None),  # no child yet: start one
        ([PLAIN_BUSY], "m:f", "plain", 1, None),  # a plain run has its child to itself
        ([PLAIN_BUSY, IDLE], "m:f", "plain", 1, 1),
        ([IDLE, IDLE_WARM], "m:f", "plain", 1, 1),  # the child that ran it before
        ([RETIRING], "m:f", "plain", 1, None),  # a recycled child takes nothing more
        ([ASYNC_ONE], "m:g", None, 4, None),  # not known to be async: a child of its own
        ([ASYNC_ONE], "m:g", "plain", 4, None),
        ([ASYNC_ONE], "m:g", "async", 1, None),  # at its concurrency
        ([ASYNC_ONE], "m:g", "async", 2, 0),
        ([IDLE, ASYNC_ONE, ASYNC_TWO], "m:g", "async", 3, 2),  # packed into the busiest
        ([IDLE, ASYNC_TWO], "m:g", "async", 2, 0),  # full: the idle one
        ([PLAIN_BUSY], "m:g", "async", 4, None),  # never beside a plain run
        ([IDLE_WARM, IDLE_WARM], "m:f", "plain", 1, 0),  # a tie: the first
        ([IDLE, RETIRING, IDLE_WARM], "m:f", None, 1, 2),
        ([IDLE_G, ASYNC_ONE], "m:g", "async", 2, 1),  # both ran it: the busier
        ([ASYNC_ONE, IDLE_G], "m:g", "plain", 2, 1),
    ],
)
def test_choose(
    children: list[ChildView],
    fn: str,
    kind: placement.Kind | None,
    concurrency: int,
    expected: int | None,
) -> None:
    assert placement.choose(children, fn, kind, concurrency) == expected


@pytest.mark.parametrize(
    ("invocations", "rss_mb", "max_invocations", "max_memory_mb", "expected"),
    [
        (1_000_000, 100_000, None, None, False),  # no limits: never
        (2, 10, 3, None, False),
        (3, 10, 3, None, True),  # after the invocation that reaches the count
        (1, 100, None, 100, False),  # at the limit is not above it
        (1, 101, None, 100, True),
        (1, 101, 5, 100, True),
    ],
)
def test_recycle(
    invocations: int,
    rss_mb: int,
    max_invocations: int | None,
    max_memory_mb: float | None,
    expected: bool,
) -> None:
    rss = rss_mb * placement.MIB
    decided = placement.recycle(
        invocations, rss, max_invocations=max_invocations, max_memory_mb=max_memory_mb
    )
    assert decided is expected


def _chosen_as_written(
    children: list[ChildView], fn: str, kind: placement.Kind | None, concurrency: int
) -> int | None:
    """The rule as the module's docstring states it, the slow way round."""
    fits = [
        i
        for i, c in enumerate(children)
        if not c.retiring
        and (c.running == 0 or (kind == "async" and c.all_async and c.running < concurrency))
    ]
    if not fits:
        return None
    return min(fits, key=lambda i: (fn not in children[i].seen, -children[i].running, i))


_children = st.lists(
    st.builds(
        ChildView,
        running=st.integers(0, 3),
        all_async=st.booleans(),
        seen=st.frozensets(st.sampled_from(["m:f", "m:g"])),
        retiring=st.booleans(),
    ),
    max_size=6,
)


@given(
    children=_children,
    fn=st.sampled_from(["m:f", "m:g"]),
    kind=st.sampled_from([None, "plain", "async"]),
    concurrency=st.integers(1, 4),
)
def test_choose_is_the_rule_as_written(
    children: list[ChildView], fn: str, kind: placement.Kind | None, concurrency: int
) -> None:
    expected = _chosen_as_written(children, fn, kind, concurrency)
    assert placement.choose(children, fn, kind, concurrency) == expected
