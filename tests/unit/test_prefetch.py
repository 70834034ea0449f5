"""How many invocations a daemon claims ahead, learned from its run and round-trip times
(daemon/prefetch.py): given durations, no clock."""

from __future__ import annotations

import pytest

from lakeshore.daemon.prefetch import CEILING, Prefetch


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
