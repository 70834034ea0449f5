"""The hindsight baseline and the windows met, as ``lakeshore simulate --target-wait``
reports them: pure arithmetic on a workload and its waits."""

from __future__ import annotations

import math

from lakeshore.elasticity import hindsight


def test_waits_are_first_come_first_served_on_the_free_slots() -> None:
    work = [(0.0, 10.0), (0.0, 10.0), (0.0, 10.0), (5.0, 1.0)]
    assert hindsight.waits_of(work, 2) == [0.0, 0.0, 10.0, 5.0]


def test_the_smallest_fleet_is_the_fewest_daemons_meeting_the_target() -> None:
    burst = [(0.0, 60.0)] * 10  # ten at once, a minute each
    assert hindsight.smallest_fleet(burst, 0.0, 1) == 10  # nobody waits: one each
    assert hindsight.smallest_fleet(burst, 60.0, 1) == 5  # the second five wait a minute
    assert hindsight.smallest_fleet(burst, 60.0, 5) == 1  # one daemon of five slots
    assert hindsight.smallest_fleet([], 60.0, 1) == 0


def test_a_window_meets_the_target_when_its_submits_p95_wait_does() -> None:
    started = [(10.0, 5.0), (20.0, 5.0), (400.0, 100.0), (410.0, 1.0)]
    assert hindsight.windows_met(started, 30.0) == {0: True, 1: False}


def test_the_baseline_holds_each_hours_smallest_fleet_for_the_hour() -> None:
    quiet = [(float(t), 30.0) for t in range(0, 3_600, 60)]  # one a minute, 30 s each
    burst = [(3_600.0, 60.0)] * 10
    floor = hindsight.baseline(quiet + burst, 60.0, 7_200.0)
    assert floor.fleet == (1, 5)
    assert floor.daemon_hours == 6.0
    assert floor.windows == 13 and len(floor.met) == 13


def test_a_policy_is_scored_on_the_windows_the_baseline_meets() -> None:
    work = [(0.0, 30.0), (400.0, 30.0)]
    floor = hindsight.baseline(work, 10.0, 3_600.0)
    late = [(0.0, 0.0), (400.0, 50.0)]  # the second window misses
    score = hindsight.score(late, 2.0, 10.0, floor)
    assert (score.windows_met, score.met_where_baseline_met) == (0.5, 0.5)
    assert score.over_floor == 2.0  # one daemon for the hour is the floor
    nothing = hindsight.baseline([], 10.0, 3_600.0)
    assert hindsight.score([], 1.0, 10.0, nothing).over_floor == math.inf
