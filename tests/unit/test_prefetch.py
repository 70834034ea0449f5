"""How many invocations a daemon claims ahead, learned from its run and round-trip times
(daemon/prefetch.py): given durations, no clock."""

from __future__ import annotations

import pytest

from lakeshore.daemon.prefetch import CEILING, KEYED_CLAIM, KEYED_MEMORY, Prefetch


@pytest.mark.parametrize(
    ("capacity", "runs", "trips", "ahead"),
    [
        (4, [], [], 0),  # nothing learned yet: nothing held ahead
        (4, [0.001], [], 0),  # no round trip measured yet
        (4, [], [0.010], 0),  # no run measured yet
        (4, [0.001], [0.010], 160),  # 4 slots x 10 trips' worth x headroom 4
        (8, [0.0002], [0.030], CEILING),  # tiny invocations: as many as allowed
        (4, [0.5], [0.010], 0),  # longer than 16 round trips: none held ahead
        (1, [0.040], [0.010], 1),  # one slot, a run of four trips: one ahead
        (4, [0.0], [0.010], CEILING),  # a run too short to time: the ceiling
    ],
)
def test_what_is_held_ahead(
    capacity: int, runs: list[float], trips: list[float], ahead: int
) -> None:
    prefetch = Prefetch(capacity)
    for seconds in runs:
        prefetch.ran(seconds)
    for seconds in trips:
        prefetch.tripped(seconds)
    assert prefetch.value == ahead
    assert prefetch.declared == CEILING  # the hello declares the most it may hold


def test_longer_invocations_shrink_it_to_none() -> None:
    prefetch = Prefetch(4)
    prefetch.tripped(0.010)
    for _ in range(5):
        prefetch.ran(0.001)
    grown = prefetch.value
    assert grown > 100
    values = []
    for _ in range(30):  # the work turns long: each average moves a fifth of the way
        prefetch.ran(2.0)
        values.append(prefetch.value)
    assert values == sorted(values, reverse=True) and values[-1] == 0


@pytest.mark.parametrize("fixed", [0, 7, 1000])
def test_prefetch_n_fixes_it(fixed: int) -> None:
    prefetch = Prefetch(4, fixed=fixed)
    prefetch.ran(0.0001)
    prefetch.tripped(1.0)
    assert (prefetch.value, prefetch.declared) == (fixed, fixed)


@pytest.mark.parametrize(
    ("answers", "free", "asked"),
    [
        ([], 500, 500),  # nothing handed yet: all it may hold
        ([(0, 500)], 500, 500),  # work without keys: all it may hold
        ([(1, 0)], 500, KEYED_CLAIM),  # a keyed invocation: a little at a time
        ([(1, 0)], 3, 3),  # never more than it may hold
        ([(3, 97)], 500, KEYED_CLAIM),  # a mixed answer counts as keyed
        ([(1, 0), (0, KEYED_MEMORY - 1)], 500, KEYED_CLAIM),  # keyed work not long ago
        ([(1, 0), (0, KEYED_MEMORY)], 500, 500),  # none for KEYED_MEMORY: all again
        ([(1, 0), (0, KEYED_MEMORY), (2, 0)], 500, KEYED_CLAIM),  # keys again
        ([(1, KEYED_MEMORY)], 500, 500),  # an answer's unkeyed ones count after its keyed
    ],
)
def test_keyed_work_is_claimed_a_little_at_a_time(
    answers: list[tuple[int, int]], free: int, asked: int
) -> None:
    prefetch = Prefetch(8)
    for keyed, plain in answers:
        prefetch.handed(keyed, plain)
    assert prefetch.claim(free) == asked


def test_keys_leave_what_is_held_ahead_as_learned() -> None:
    prefetch = Prefetch(8)
    prefetch.ran(0.0001)
    prefetch.tripped(0.050)
    prefetch.handed(1, 0)
    assert prefetch.keyed
    assert (prefetch.value, prefetch.declared) == (CEILING, CEILING)
