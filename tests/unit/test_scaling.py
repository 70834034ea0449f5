"""Every rule and boundary of ``spec/scaling-rules.txt``, as tables, plus properties."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from lakeshore.domain.custom_scaler import interpret_scaler_answer, scaler_failed
from lakeshore.domain.queue import Elasticity, QueueSpec
from lakeshore.domain.scaling import (
    ACTIONS,
    Counters,
    Decision,
    Policy,
    Signals,
    decide,
    downgrade,
    no_provider_reason,
    target_of,
    update_counters,
)

PROPERTY = settings(max_examples=150, deadline=None)
KINDS = ("fixed", "fully_elastic", "pool_with_threshold", "max_count")


def sig(daemons: int = 0, util: float = 0.0, pending: int = 0, in_flight: int = 0) -> Signals:
    return Signals(daemon_count=daemons, utilization=util, pending=pending, in_flight=in_flight)


def fe(**bounds: Any) -> Policy:
    return Policy("fully_elastic", **bounds)


def mc(**bounds: Any) -> Policy:
    return Policy("max_count", **bounds)


def pwt(**bounds: Any) -> Policy:
    return Policy("pool_with_threshold", **bounds)


# --- the policy a queue declares ---------------------------------------------------------


def test_no_elasticity_is_fixed_with_defaults() -> None:
    assert Policy.from_elasticity(None) == Policy("fixed", min=0, max=None, high=0.8, low=0.3)


def test_a_written_elasticity_carries_its_bounds_and_thresholds() -> None:
    written = Elasticity(
        kind="pool_with_threshold", min=2, max=16, threshold=0.7, threshold_low=0.2
    )
    assert Policy.from_elasticity(written) == Policy("pool_with_threshold", 2, 16, 0.7, 0.2)


def test_unset_bounds_and_thresholds_take_the_spec_defaults() -> None:
    policy = Policy.from_elasticity(Elasticity(kind="pool_with_threshold"))
    assert (policy.min, policy.max, policy.high, policy.low) == (0, None, 0.8, 0.3)


def test_a_stored_kind_this_server_does_not_know_is_representable() -> None:
    stored = Elasticity.model_construct(kind="turbo", max=3)  # written by a newer server
    assert Policy.from_elasticity(stored).kind == "turbo"


@pytest.mark.parametrize(
    ("policy", "ceiling"),
    [
        (fe(), None),  # unbounded
        (fe(max=4), 4),
        (mc(), 0),  # max_count: unset max is 0
        (mc(max=4), 4),
        (pwt(), None),
        (pwt(max=16), 16),
    ],
)
def test_the_ceiling_depends_on_the_kind(policy: Policy, ceiling: int | None) -> None:
    assert policy.ceiling == ceiling


# --- fixed and unknown kinds -------------------------------------------------------------


@pytest.mark.parametrize(
    "signals", [sig(), sig(daemons=3, util=1.0, pending=500), sig(daemons=9, util=0.0)]
)
def test_fixed_never_scales(signals: Signals) -> None:
    decision = decide(Policy("fixed"), signals, Counters(above=5))
    assert decision.action == "tick_noop"
    assert decision.reason == "fixed: no-op"
    assert decision.rule == "fixed"
    assert decision.counters == Counters()


@pytest.mark.parametrize("kind", ["turbo", "fully-elastic", "", "FIXED"])
def test_an_unknown_kind_is_a_noop_with_the_spec_reason(kind: str) -> None:
    decision = decide(Policy(kind, max=9), sig(pending=50, util=1.0), Counters(above=3))
    assert decision.action == "tick_noop"
    assert decision.reason == f'unknown elasticity.kind="{kind}" — defaulting to no-op'
    assert decision.rule == "unknown_kind"
    assert decision.counters == Counters()


# --- fully_elastic and max_count ---------------------------------------------------------

# (policy, signals, action, target, rule suffix, exact reason)
TARGET_RULES = [
    # fully_elastic, defaults (min 0, max unbounded)
    pytest.param(
        fe(), sig(1, pending=3, in_flight=1), "scale_up", 3, "scale_up",
        "target 3 > daemons 1 + in flight 1 → launch", id="fe up",
    ),
    pytest.param(
        fe(), sig(0, pending=1000), "scale_up", 1000, "scale_up",
        "target 1000 > daemons 0 + in flight 0 → launch", id="fe max unbounded by default",
    ),
    pytest.param(
        fe(), sig(2, pending=3), "scale_up", 3, "scale_up",
        "target 3 > daemons 2 + in flight 0 → launch", id="fe up by exactly one",
    ),
    pytest.param(
        fe(), sig(3, pending=3), "tick_noop", 3, "steady",
        "target 3 = daemons 3 (in flight 0): steady", id="fe steady",
    ),
    pytest.param(
        fe(), sig(0), "tick_noop", 0, "steady",
        "target 0 = daemons 0 (in flight 0): steady", id="fe idle at zero",
    ),
    pytest.param(
        fe(), sig(5, pending=2), "scale_down", 2, "scale_down",
        "daemons 5 > target 2 and > min 0 → kill one", id="fe down",
    ),
    pytest.param(
        fe(), sig(1, pending=0), "scale_down", 0, "scale_down",
        "daemons 1 > target 0 and > min 0 → kill one", id="fe drains to zero",
    ),
    # in_flight subtracts from the target
    pytest.param(
        fe(), sig(1, pending=3, in_flight=2), "tick_noop", 3, "in_flight",
        "target 3 <= daemons 1 + in flight 2: waiting on launches", id="fe in flight covers",
    ),
    pytest.param(
        fe(), sig(0, pending=3, in_flight=2), "scale_up", 3, "scale_up",
        "target 3 > daemons 0 + in flight 2 → launch", id="fe in flight short by one",
    ),
    pytest.param(
        fe(), sig(0, pending=1, in_flight=4), "tick_noop", 1, "in_flight",
        "target 1 <= daemons 0 + in flight 4: waiting on launches", id="fe in flight surplus",
    ),
    # min floors the target
    pytest.param(
        fe(min=2), sig(0), "scale_up", 2, "scale_up",
        "target 2 > daemons 0 + in flight 0 → launch", id="fe min floor launches",
    ),
    pytest.param(
        fe(min=2), sig(3), "scale_down", 2, "scale_down",
        "daemons 3 > target 2 and > min 2 → kill one", id="fe down to min",
    ),
    pytest.param(
        fe(min=2), sig(2), "tick_noop", 2, "at_min",
        "at min (2): pending 0 → target 2, daemons 2", id="fe at min names the bound",
    ),
    pytest.param(
        fe(min=2), sig(2, pending=2), "tick_noop", 2, "steady",
        "target 2 = daemons 2 (in flight 0): steady", id="fe at min but pending wants it",
    ),
    # max caps the target
    pytest.param(
        fe(max=4), sig(4, pending=9), "tick_noop", 4, "at_max",
        "at max (4): pending 9 → target 4, daemons 4 + in flight 0", id="fe at max",
    ),
    pytest.param(
        fe(max=4), sig(3, pending=9, in_flight=1), "tick_noop", 4, "at_max",
        "at max (4): pending 9 → target 4, daemons 3 + in flight 1", id="fe at max in flight",
    ),
    pytest.param(
        fe(max=4), sig(3, pending=9), "scale_up", 4, "scale_up",
        "target 4 > daemons 3 + in flight 0 → launch", id="fe up to max",
    ),
    pytest.param(
        fe(max=4), sig(4, pending=4), "tick_noop", 4, "steady",
        "target 4 = daemons 4 (in flight 0): steady", id="fe pending equal to max is no bound",
    ),
    pytest.param(
        fe(max=4), sig(6, pending=9), "scale_down", 4, "scale_down",
        "daemons 6 > target 4 and > min 0 → kill one", id="fe above max kills",
    ),
    pytest.param(
        fe(min=1, max=16), sig(16, pending=40), "tick_noop", 16, "at_max",
        "at max (16): pending 40 → target 16, daemons 16 + in flight 0", id="fe at max 16",
    ),
    # max_count: the same arithmetic, unset max is 0
    pytest.param(
        mc(), sig(0, pending=5), "tick_noop", 0, "at_max",
        "at max (0): max unset → 0 for max_count; pending 5 → target 0, "
        "daemons 0 + in flight 0",
        id="mc unset max scales nothing up",
    ),
    pytest.param(
        mc(), sig(0), "tick_noop", 0, "steady",
        "target 0 = daemons 0 (in flight 0): steady", id="mc unset max idle",
    ),
    pytest.param(
        mc(), sig(2, pending=5), "scale_down", 0, "scale_down",
        "daemons 2 > target 0 and > min 0 → kill one", id="mc unset max drains",
    ),
    pytest.param(
        mc(min=2), sig(0, pending=5), "scale_up", 2, "scale_up",
        "target 2 > daemons 0 + in flight 0 → launch", id="mc unset max, min floor wins",
    ),
    pytest.param(
        mc(max=4), sig(0, pending=2), "scale_up", 2, "scale_up",
        "target 2 > daemons 0 + in flight 0 → launch", id="mc up",
    ),
    pytest.param(
        mc(max=4), sig(4, pending=9), "tick_noop", 4, "at_max",
        "at max (4): pending 9 → target 4, daemons 4 + in flight 0", id="mc at max",
    ),
    pytest.param(
        mc(max=4), sig(3, pending=0), "scale_down", 0, "scale_down",
        "daemons 3 > target 0 and > min 0 → kill one", id="mc drains to zero",
    ),
    pytest.param(
        mc(max=4), sig(1, pending=3, in_flight=2), "tick_noop", 3, "in_flight",
        "target 3 <= daemons 1 + in flight 2: waiting on launches", id="mc in flight",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("policy", "signals", "action", "target", "rule", "reason"), TARGET_RULES)
def test_target_rules(
    policy: Policy, signals: Signals, action: str, target: int, rule: str, reason: str
) -> None:
    decision = decide(policy, signals, Counters(above=1, below=0))
    assert decision.action == action
    assert decision.target == target
    assert decision.rule == f"{policy.kind}.{rule}"
    assert decision.reason == reason
    assert decision.counters == Counters()  # the counters are pool_with_threshold's only
    assert decision.blocked_by == {"at_max": "max", "at_min": "min"}.get(rule)


@pytest.mark.parametrize(
    ("policy", "pending", "target"),
    [
        (fe(), 7, 7),
        (fe(min=3), 1, 3),
        (fe(max=5), 9, 5),
        (fe(min=2, max=5), 0, 2),
        (mc(), 9, 0),
        (mc(max=5), 9, 5),
        (mc(min=1), 9, 1),
    ],
)
def test_target_is_pending_capped_at_max_and_floored_at_min(
    policy: Policy, pending: int, target: int
) -> None:
    assert target_of(policy, pending) == target


def test_a_noop_says_what_would_make_it_scale() -> None:
    steady = decide(fe(), sig(1, pending=1), Counters())
    assert steady.hint is not None
    assert "scales up when pending exceeds daemons + in flight (1 + 0)" in steady.hint
    at_max = decide(fe(max=4), sig(4, pending=9), Counters())
    assert at_max.hint == "raise max above 4"
    unset = decide(mc(), sig(0, pending=3), Counters())
    assert unset.hint == "set max above 0"
    at_min = decide(fe(min=2), sig(2), Counters())
    assert at_min.hint is not None and at_min.hint.startswith("lower min below 2")


# --- pool_with_threshold -----------------------------------------------------------------

# (policy, utilization, counters in, daemons, in flight, action, counters out, rule, reason)
THRESHOLD_RULES = [
    # defaults 0.8 / 0.3, >= and <= exactly at the threshold
    pytest.param(
        pwt(), 0.8, Counters(1, 0), 1, 0, "scale_up", Counters(0, 0), "scale_up",
        "utilization 0.80 >= 0.80 for 2 ticks → launch", id="high boundary is >=",
    ),
    pytest.param(
        pwt(), 0.91, Counters(1, 0), 1, 0, "scale_up", Counters(0, 0), "scale_up",
        "utilization 0.91 >= 0.80 for 2 ticks → launch", id="up after two ticks",
    ),
    pytest.param(
        pwt(), 0.79, Counters(1, 0), 1, 0, "tick_noop", Counters(0, 0), "dead_band",
        "utilization 0.79 between 0.30 and 0.80 (dead band): counters reset",
        id="just under high is the dead band",
    ),
    pytest.param(
        pwt(), 0.795, Counters(1, 0), 1, 0, "tick_noop", Counters(0, 0), "dead_band",
        "utilization 0.795 between 0.300 and 0.800 (dead band): counters reset",
        id="rounding does not hide the difference",
    ),
    pytest.param(
        pwt(), 0.3, Counters(0, 1), 2, 0, "scale_down", Counters(0, 0), "scale_down",
        "utilization 0.30 <= 0.30 for 2 ticks → kill one", id="low boundary is <=",
    ),
    pytest.param(
        pwt(), 0.31, Counters(0, 1), 2, 0, "tick_noop", Counters(0, 0), "dead_band",
        "utilization 0.31 between 0.30 and 0.80 (dead band): counters reset",
        id="just over low is the dead band",
    ),
    pytest.param(
        pwt(), 0.5, Counters(1, 0), 1, 0, "tick_noop", Counters(0, 0), "dead_band",
        "utilization 0.50 between 0.30 and 0.80 (dead band): counters reset",
        id="dead band resets above",
    ),
    pytest.param(
        pwt(), 0.5, Counters(0, 7), 4, 0, "tick_noop", Counters(0, 0), "dead_band",
        "utilization 0.50 between 0.30 and 0.80 (dead band): counters reset",
        id="dead band resets below",
    ),
    # the window is two consecutive ticks
    pytest.param(
        pwt(), 0.9, Counters(0, 0), 1, 0, "tick_noop", Counters(1, 0), "warming_up",
        "utilization 0.90 >= 0.80 for 1 tick (needs 2)", id="one high tick is not enough",
    ),
    pytest.param(
        pwt(), 0.1, Counters(0, 0), 3, 0, "tick_noop", Counters(0, 1), "cooling_down",
        "utilization 0.10 <= 0.30 for 1 tick (needs 2)", id="one low tick is not enough",
    ),
    pytest.param(
        pwt(), 0.9, Counters(0, 1), 3, 0, "tick_noop", Counters(1, 0), "warming_up",
        "utilization 0.90 >= 0.80 for 1 tick (needs 2)", id="above resets below",
    ),
    pytest.param(
        pwt(), 0.1, Counters(1, 0), 3, 0, "tick_noop", Counters(0, 1), "cooling_down",
        "utilization 0.10 <= 0.30 for 1 tick (needs 2)", id="below resets above",
    ),
    # custom thresholds
    pytest.param(
        pwt(high=0.7, low=0.2), 0.7, Counters(1, 0), 1, 0, "scale_up", Counters(0, 0),
        "scale_up", "utilization 0.70 >= 0.70 for 2 ticks → launch", id="custom high",
    ),
    pytest.param(
        pwt(high=0.7, low=0.2), 0.69, Counters(1, 0), 1, 0, "tick_noop", Counters(0, 0),
        "dead_band", "utilization 0.69 between 0.20 and 0.70 (dead band): counters reset",
        id="custom high boundary",
    ),
    pytest.param(
        pwt(high=0.7, low=0.2), 0.2, Counters(0, 1), 1, 0, "scale_down", Counters(0, 0),
        "scale_down", "utilization 0.20 <= 0.20 for 2 ticks → kill one", id="custom low",
    ),
    pytest.param(
        pwt(high=0.7, low=0.2), 0.25, Counters(0, 1), 1, 0, "tick_noop", Counters(0, 0),
        "dead_band", "utilization 0.25 between 0.20 and 0.70 (dead band): counters reset",
        id="custom low boundary",
    ),
    # bounds: a bound hit names it and keeps the counter
    pytest.param(
        pwt(max=4), 0.9, Counters(1, 0), 4, 0, "tick_noop", Counters(2, 0), "at_max",
        "at max (4): utilization 0.90 >= 0.80 for 2 ticks, daemons 4 + in flight 0",
        id="at max keeps the counter",
    ),
    pytest.param(
        pwt(max=4), 0.9, Counters(1, 0), 3, 1, "tick_noop", Counters(2, 0), "at_max",
        "at max (4): utilization 0.90 >= 0.80 for 2 ticks, daemons 3 + in flight 1",
        id="in flight counts toward max",
    ),
    pytest.param(
        pwt(max=4), 0.9, Counters(1, 0), 3, 0, "scale_up", Counters(0, 0), "scale_up",
        "utilization 0.90 >= 0.80 for 2 ticks → launch", id="one under max launches",
    ),
    pytest.param(
        pwt(max=16), 1.0, Counters(5, 0), 16, 0, "tick_noop", Counters(2, 0), "at_max",
        "at max (16): utilization 1.00 >= 0.80 for 2 ticks, daemons 16 + in flight 0",
        id="counter stays satisfied at max, saturated at the window",
    ),
    pytest.param(
        pwt(), 1.0, Counters(1, 0), 1000, 0, "scale_up", Counters(0, 0), "scale_up",
        "utilization 1.00 >= 0.80 for 2 ticks → launch", id="max unbounded by default",
    ),
    pytest.param(
        pwt(min=2), 0.1, Counters(0, 1), 2, 0, "tick_noop", Counters(0, 2), "at_min",
        "at min (2): utilization 0.10 <= 0.30 for 2 ticks, daemons 2", id="at min",
    ),
    pytest.param(
        pwt(min=2), 0.1, Counters(0, 1), 3, 0, "scale_down", Counters(0, 0), "scale_down",
        "utilization 0.10 <= 0.30 for 2 ticks → kill one", id="above min kills",
    ),
    pytest.param(
        pwt(), 0.0, Counters(0, 1), 1, 0, "scale_down", Counters(0, 0), "scale_down",
        "utilization 0.00 <= 0.30 for 2 ticks → kill one", id="min 0 can leave zero",
    ),
    pytest.param(
        pwt(), 0.0, Counters(0, 1), 0, 0, "tick_noop", Counters(0, 2), "at_min",
        "at min (0): utilization 0.00 <= 0.30 for 2 ticks, daemons 0", id="nothing to kill",
    ),
    # "Keep min daemons warm": below min, counting launches in flight, launch one
    pytest.param(
        pwt(min=2, max=4), 0.0, Counters(0, 1), 0, 0, "scale_up", Counters(0, 2), "below_min",
        "below min (2): daemons 0 + in flight 0 → launch", id="below min launches, idle or not",
    ),
    pytest.param(
        pwt(min=2), 0.0, Counters(), 1, 0, "scale_up", Counters(0, 1), "below_min",
        "below min (2): daemons 1 + in flight 0 → launch", id="one under min launches",
    ),
    pytest.param(
        pwt(min=2), 0.0, Counters(), 1, 1, "tick_noop", Counters(0, 1), "cooling_down",
        "utilization 0.00 <= 0.30 for 1 tick (needs 2)", id="a launch in flight counts toward min",
    ),
    pytest.param(
        pwt(min=3), 0.9, Counters(1, 0), 1, 0, "scale_up", Counters(0, 0), "below_min",
        "below min (3): daemons 1 + in flight 0 → launch", id="a due window is spent by the launch",
    ),
    pytest.param(
        pwt(min=2), 0.9, Counters(), 1, 0, "scale_up", Counters(1, 0), "below_min",
        "below min (2): daemons 1 + in flight 0 → launch", id="a window under way is kept",
    ),
    pytest.param(
        pwt(min=5, max=2), 0.0, Counters(), 2, 0, "tick_noop", Counters(0, 1), "cooling_down",
        "utilization 0.00 <= 0.30 for 1 tick (needs 2)", id="never past max",
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("policy", "util", "before", "daemons", "in_flight", "action", "after", "rule", "reason"),
    THRESHOLD_RULES,
)
def test_threshold_rules(
    policy: Policy,
    util: float,
    before: Counters,
    daemons: int,
    in_flight: int,
    action: str,
    after: Counters,
    rule: str,
    reason: str,
) -> None:
    decision = decide(policy, sig(daemons, util=util, in_flight=in_flight), before)
    assert decision.action == action
    assert decision.counters == after
    assert decision.rule == f"pool_with_threshold.{rule}"
    assert decision.reason == reason
    assert decision.blocked_by == {"at_max": "max", "at_min": "min"}.get(rule)


def test_custom_thresholds_move_the_dead_band() -> None:
    reading = sig(1, util=0.75)
    assert decide(pwt(), reading, Counters(1, 0)).rule == "pool_with_threshold.dead_band"
    assert decide(pwt(high=0.7), reading, Counters(1, 0)).action == "scale_up"


def run(policy: Policy, readings: list[float], daemons: int = 1) -> Iterator[Decision]:
    """Feed readings tick by tick, carrying the counters; the fleet size stays put."""
    counters = Counters()
    for util in readings:
        decision = decide(policy, sig(daemons, util=util), counters)
        counters = decision.counters
        yield decision


def test_the_acting_counter_resets_so_each_step_needs_two_more_ticks() -> None:
    actions = [d.action for d in run(pwt(), [0.9] * 6)]
    assert actions == ["tick_noop", "scale_up"] * 3
    actions = [d.action for d in run(pwt(), [0.1] * 4, daemons=9)]
    assert actions == ["tick_noop", "scale_down"] * 2


def test_the_dead_band_breaks_the_window() -> None:
    actions = [d.action for d in run(pwt(), [0.9, 0.5, 0.9, 0.1, 0.9, 0.6, 0.2])]
    assert actions == ["tick_noop"] * 7


def test_a_bound_hit_keeps_the_counter_so_the_step_comes_as_soon_as_room_does() -> None:
    policy, counters = pwt(max=2), Counters()
    for expected in (1, 2, 2, 2):  # satisfied, and saturated at the window
        decision = decide(policy, sig(2, util=0.95), counters)
        counters = decision.counters
        assert decision.action == "tick_noop"
        assert counters == Counters(above=expected)
    assert decision.reason.startswith("at max (2): ")
    again = decide(policy, sig(2, util=0.95), counters)
    assert again == decision  # the same no-op, tick after tick: one feed row
    # a daemon goes away: the next high tick launches at once, without a fresh window
    decision = decide(policy, sig(1, util=0.95), counters)
    assert decision.action == "scale_up"
    assert decision.counters == Counters()


@pytest.mark.parametrize(
    ("util", "before", "after"),
    [
        (0.8, Counters(0, 0), Counters(1, 0)),
        (0.8, Counters(1, 0), Counters(2, 0)),
        (0.8, Counters(2, 0), Counters(2, 0)),  # saturated at the window
        (0.8, Counters(3, 0), Counters(2, 0)),  # a count stored by an older server
        (0.3, Counters(2, 0), Counters(0, 1)),
        (0.3, Counters(0, 1), Counters(0, 2)),
        (0.3, Counters(0, 4), Counters(0, 2)),
        (0.55, Counters(3, 0), Counters(0, 0)),
        (0.55, Counters(0, 3), Counters(0, 0)),
    ],
)
def test_update_counters(util: float, before: Counters, after: Counters) -> None:
    assert update_counters(pwt(), util, before) == after


def test_a_warming_up_noop_says_how_many_more_ticks() -> None:
    decision = decide(pwt(), sig(1, util=0.85), Counters())
    assert decision.hint == "needs utilization >= 0.80 on 1 more tick"
    decision = decide(pwt(min=1), sig(3, util=0.25), Counters())
    assert decision.hint == "needs utilization <= 0.30 on 1 more tick"
    assert decide(pwt(max=4), sig(4, util=0.9), Counters(1, 0)).hint == "raise max above 4"


# --- failures and the no-provider reason -------------------------------------------------


def test_the_no_provider_reason_is_the_spec_string() -> None:
    assert (
        no_provider_reason("training")
        == 'queue "training" has no providerRef / daemonTemplate.provider — cannot launch'
    )


def test_a_failed_step_is_downgraded_with_the_failure_appended() -> None:
    decision = decide(fe(), sig(0, pending=2), Counters())
    failed = downgrade(decision, no_provider_reason("q"))
    assert failed.action == "tick_noop"
    assert failed.reason == (
        "target 2 > daemons 0 + in flight 0 → launch; "
        'queue "q" has no providerRef / daemonTemplate.provider — cannot launch'
    )
    assert failed.rule == "fully_elastic.scale_up"


# --- custom scalers ----------------------------------------------------------------------


class _Exploding(Mapping[str, Any]):
    def __getitem__(self, key: str) -> Any:
        raise RuntimeError("boom")

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


class _Unprintable:
    def __repr__(self) -> str:
        raise ValueError("no")


ROOM = sig(2, util=0.5, pending=5, in_flight=0)

SCALER_ANSWERS = [
    pytest.param("scale_up", "scale_up", "custom scaler answered scale_up", id="up"),
    pytest.param("scale_down", "scale_down", "custom scaler answered scale_down", id="down"),
    pytest.param("tick_noop", "tick_noop", "custom scaler answered tick_noop", id="noop"),
    pytest.param(
        {"action": "scale_down", "reason": "queue is quiet"}, "scale_down",
        "custom scaler answered scale_down: queue is quiet", id="mapping with reason",
    ),
    pytest.param(
        {"action": "scale_up"}, "scale_up", "custom scaler answered scale_up",
        id="mapping without reason",
    ),
    pytest.param(
        "SCALE_UP", "tick_noop",
        "custom scaler answer ignored: unknown action 'SCALE_UP' — no-op", id="wrong case",
    ),
    pytest.param(
        42, "tick_noop",
        'custom scaler answer ignored: expected an action string or a mapping with "action", '
        "got int — no-op",
        id="int",
    ),
    pytest.param(
        None, "tick_noop",
        'custom scaler answer ignored: expected an action string or a mapping with "action", '
        "got NoneType — no-op",
        id="none",
    ),
    pytest.param(
        ["scale_up"], "tick_noop",
        'custom scaler answer ignored: expected an action string or a mapping with "action", '
        "got list — no-op",
        id="list",
    ),
    pytest.param(
        {"reason": "x"}, "tick_noop",
        'custom scaler answer ignored: the mapping has no "action" — no-op', id="no action",
    ),
    pytest.param(
        {"action": 1}, "tick_noop",
        "custom scaler answer ignored: unknown action 1 — no-op", id="action not a string",
    ),
    pytest.param(
        {"action": "scale_up", "reason": 5}, "tick_noop",
        'custom scaler answer ignored: "reason" must be a string, got int — no-op',
        id="reason not a string",
    ),
    pytest.param(
        _Exploding(), "tick_noop",
        "custom scaler answer ignored: reading the answer raised RuntimeError — no-op",
        id="mapping that raises",
    ),
    pytest.param(
        {"action": _Unprintable()}, "tick_noop",
        "custom scaler answer ignored: unknown action <unprintable _Unprintable> — no-op",
        id="unprintable action",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("answer", "action", "reason"), SCALER_ANSWERS)
def test_custom_scaler_answers(answer: object, action: str, reason: str) -> None:
    decision = interpret_scaler_answer(answer, fe(max=10), ROOM)
    assert decision.action == action
    assert decision.reason == reason
    assert decision.counters == Counters()
    assert decision.rule == (
        "custom_scaler" if "ignored" not in reason else "custom_scaler.invalid"
    )


# (answer, policy, signals, action, reason)
SCALER_BOUNDS = [
    pytest.param(
        "scale_up", fe(max=4), sig(3, in_flight=1), "tick_noop",
        "at max (4): custom scaler answered scale_up, daemons 3 + in flight 1", id="at max",
    ),
    pytest.param(
        "scale_up", fe(max=4), sig(3), "scale_up", "custom scaler answered scale_up",
        id="under max",
    ),
    pytest.param(
        "scale_up", mc(), sig(0), "tick_noop",
        "at max (0): custom scaler answered scale_up, daemons 0 + in flight 0",
        id="max_count unset max",
    ),
    pytest.param(
        "scale_up", fe(), sig(500, in_flight=9), "scale_up", "custom scaler answered scale_up",
        id="unbounded",
    ),
    pytest.param(
        {"action": "scale_down", "reason": "cheap"}, fe(min=2), sig(2), "tick_noop",
        "at min (2): custom scaler answered scale_down: cheap, daemons 2", id="at min",
    ),
    pytest.param(
        "scale_down", fe(), sig(0), "tick_noop",
        "at min (0): custom scaler answered scale_down, daemons 0", id="nothing to kill",
    ),
    pytest.param(
        "scale_down", fe(min=2), sig(3), "scale_down", "custom scaler answered scale_down",
        id="above min",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("answer", "policy", "signals", "action", "reason"), SCALER_BOUNDS)
def test_custom_scaler_answers_are_clamped_to_the_bounds(
    answer: object, policy: Policy, signals: Signals, action: str, reason: str
) -> None:
    decision = interpret_scaler_answer(answer, policy, signals)
    assert decision.action == action
    assert decision.reason == reason
    if action == "tick_noop":
        assert decision.blocked_by == ("max" if "at max" in reason else "min")


def test_a_failing_scaler_is_a_noop_with_its_message() -> None:
    decision = scaler_failed("timed out after 2.0 s")
    assert decision.action == "tick_noop"
    assert decision.reason == "custom scaler failed: timed out after 2.0 s — no-op"
    assert decision.rule == "custom_scaler.failed"


def test_a_scalers_text_is_bounded_and_printable() -> None:
    decision = scaler_failed("x" * 10_000 + "\x00")
    assert len(decision.reason) < 600
    long_reason = interpret_scaler_answer({"action": "tick_noop", "reason": "\x00y"}, fe(), ROOM)
    assert long_reason.reason == "custom scaler answered tick_noop: \\0y"


ANSWERS = st.one_of(
    st.sampled_from(ACTIONS),
    st.text(max_size=20),
    st.integers(),
    st.none(),
    st.floats(),
    st.lists(st.sampled_from(ACTIONS), max_size=3),
    st.dictionaries(
        st.sampled_from(["action", "reason", "other"]),
        st.one_of(st.sampled_from(ACTIONS), st.text(max_size=10), st.integers(), st.none()),
    ),
)


# --- properties --------------------------------------------------------------------------


@st.composite
def policies(draw: st.DrawFn) -> Policy:
    """Policies a user can write (built through the validated Elasticity model)."""
    kind = draw(st.sampled_from(KINDS))
    low_bound = draw(st.integers(0, 4))
    high_bound = draw(st.none() | st.integers(low_bound, low_bound + 6))
    low = draw(st.sampled_from([0.1, 0.25, 0.3, 0.5]))
    high = draw(st.sampled_from([0.6, 0.7, 0.8, 1.0]))
    elasticity = Elasticity(
        kind=kind, min=low_bound, max=high_bound, threshold=high, threshold_low=low
    )
    return Policy.from_elasticity(elasticity)


def upper_bound(policy: Policy) -> int | None:
    """What the controller's own launches never exceed (daemons + in flight).

    ``max`` as resolved for the kind; for ``max_count`` with an unset max and a min, the
    spec's arithmetic floors the target at min, so min is the bound there.
    """
    ceiling = policy.ceiling
    return None if ceiling is None else max(ceiling, policy.min)


UTILIZATIONS = st.one_of(st.sampled_from([0.0, 0.1, 0.3, 0.5, 0.8, 1.0]), st.floats(0.0, 1.0))

# one tick: (pending, utilization, launches resolved before it, do they land?, a launch
# lands as a daemon at once rather than staying in flight)
TICKS = st.tuples(st.integers(0, 25), UTILIZATIONS, st.integers(0, 2), st.booleans(), st.booleans())


@PROPERTY
@given(
    policy=policies(),
    daemons=st.integers(0, 12),
    in_flight=st.integers(0, 3),
    ticks=st.lists(TICKS, min_size=1, max_size=40),
)
def test_the_controller_never_breaks_its_bounds(
    policy: Policy,
    daemons: int,
    in_flight: int,
    ticks: list[tuple[int, float, int, bool, bool]],
) -> None:
    bound = upper_bound(policy)
    assume(bound is None or daemons + in_flight <= bound)  # start at or below max
    counters = Counters()
    high_run = low_run = 0  # consecutive qualifying readings fed so far
    for pending, util, resolved, land, at_once in ticks:
        for _ in range(min(resolved, in_flight)):  # tokens resolve: land or expire
            in_flight -= 1
            daemons += 1 if land else 0
        high_run = high_run + 1 if util >= policy.high else 0
        low_run = low_run + 1 if util <= policy.low and util < policy.high else 0
        decision = decide(policy, sig(daemons, util, pending, in_flight), counters)
        had = daemons + in_flight

        assert decision.action in ACTIONS  # one decision: at most one launch or kill
        assert decision.counters.above >= 0 and decision.counters.below >= 0
        assert not (decision.counters.above and decision.counters.below)
        if decision.action == "scale_up":
            if at_once:
                daemons += 1
            else:
                in_flight += 1
        elif decision.action == "scale_down":
            assert daemons > policy.min  # never below min through its own kills
            daemons -= 1
        if decision.rule == "pool_with_threshold.below_min":
            assert had < policy.min  # keeping min warm: only below it
        elif policy.kind == "pool_with_threshold" and decision.action != "tick_noop":
            assert (high_run if decision.action == "scale_up" else low_run) >= 2
            assert decision.counters == Counters()  # the acting counter resets
        if policy.kind == "fixed":
            assert decision.action == "tick_noop"
        assert bound is None or daemons + in_flight <= bound
        counters = decision.counters


@PROPERTY
@given(
    policy=policies().filter(lambda p: p.kind in ("fully_elastic", "max_count")),
    daemons=st.integers(0, 15),
    pending=st.integers(0, 25),
)
def test_target_policies_converge_on_the_target_and_stay(
    policy: Policy, daemons: int, pending: int
) -> None:
    target = target_of(policy, pending)
    for _ in range(abs(daemons - target)):
        decision = decide(policy, sig(daemons, pending=pending), Counters())
        daemons += {"scale_up": 1, "scale_down": -1, "tick_noop": 0}[decision.action]
    assert daemons == target
    assert decide(policy, sig(daemons, pending=pending), Counters()).action == "tick_noop"


@PROPERTY
@given(
    policy=policies(),
    signals=st.builds(
        Signals, st.integers(0, 20), UTILIZATIONS, st.integers(0, 50), st.integers(0, 5)
    ),
    counters=st.builds(Counters, st.integers(0, 5), st.integers(0, 5)),
)
def test_decide_is_a_pure_function(policy: Policy, signals: Signals, counters: Counters) -> None:
    first = decide(policy, signals, counters)
    assert decide(policy, signals, counters) == first
    assert first.reason  # every decision carries a reason
    if first.action == "tick_noop" and first.blocked_by is not None:
        assert first.reason.startswith(f"at {first.blocked_by} (")


@PROPERTY
@given(answer=ANSWERS, policy=policies(), daemons=st.integers(0, 12), in_flight=st.integers(0, 3))
def test_any_scaler_answer_is_read_without_raising_and_within_bounds(
    answer: object, policy: Policy, daemons: int, in_flight: int
) -> None:
    decision = interpret_scaler_answer(answer, policy, sig(daemons, in_flight=in_flight))
    assert decision.action in ACTIONS
    ceiling = policy.ceiling
    if decision.action == "scale_up":
        assert ceiling is None or daemons + in_flight + 1 <= ceiling
    if decision.action == "scale_down":
        assert daemons - 1 >= policy.min


# --- hints, pool targets and the clamped scaler's decision -------------------------------

# (policy, signals, counters in, rule, exact hint)
HINTS = [
    pytest.param(
        Policy("fixed"), sig(), Counters(), "fixed",
        "fixed never scales; set elasticity.kind to scale automatically", id="fixed",
    ),
    pytest.param(
        Policy("turbo"), sig(), Counters(), "unknown_kind",
        "set elasticity.kind to fixed, fully_elastic, pool_with_threshold or max_count",
        id="unknown kind",
    ),
    pytest.param(
        fe(), sig(1, pending=3, in_flight=2), Counters(), "fully_elastic.in_flight",
        "scales up when pending exceeds daemons + in flight (1 + 2)", id="in flight",
    ),
    pytest.param(
        fe(max=4), sig(3, pending=4, in_flight=1), Counters(), "fully_elastic.in_flight",
        "at max (4); raise max to scale up", id="in flight up to max",
    ),
    pytest.param(
        fe(), sig(3, pending=3), Counters(), "fully_elastic.steady",
        "scales up when pending exceeds daemons + in flight (3 + 0); "
        "scales down when pending drops below daemons (3)",
        id="steady",
    ),
    pytest.param(
        fe(max=4), sig(4, pending=4), Counters(), "fully_elastic.steady",
        "at max (4); raise max to scale up; scales down when pending drops below daemons (4)",
        id="steady at max",
    ),
    pytest.param(
        fe(min=2), sig(2, pending=2), Counters(), "fully_elastic.steady",
        "scales up when pending exceeds daemons + in flight (2 + 0); "
        "scales down only when min (2) is lowered",
        id="steady at min",
    ),
    pytest.param(
        mc(), sig(0), Counters(), "max_count.steady",
        "at max (0) (unset → 0 for max_count); raise max to scale up; "
        "scales down only when min (0) is lowered",
        id="max_count with max unset",
    ),
    pytest.param(
        pwt(), sig(1, util=0.5), Counters(), "pool_with_threshold.dead_band",
        "scales up after 2 ticks at utilization >= 0.80, down after 2 ticks at <= 0.30",
        id="dead band",
    ),
    pytest.param(
        pwt(min=2), sig(2, util=0.1), Counters(0, 1), "pool_with_threshold.at_min",
        "lower min below 2", id="pool at min",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("policy", "signals", "counters", "rule", "hint"), HINTS)
def test_every_noop_says_what_would_make_it_scale(
    policy: Policy, signals: Signals, counters: Counters, rule: str, hint: str
) -> None:
    decision = decide(policy, signals, counters)
    assert (decision.action, decision.rule, decision.hint) == ("tick_noop", rule, hint)


@pytest.mark.parametrize(
    ("signals", "counters", "action", "target"),
    [
        (sig(3, util=0.9), Counters(1, 0), "scale_up", 4),  # one more than it has
        (sig(3, util=0.9, in_flight=2), Counters(1, 0), "scale_up", 6),  # launches count
        (sig(0, util=1.0), Counters(1, 0), "scale_up", 1),
        (sig(3, util=0.1), Counters(0, 1), "scale_down", 2),  # one fewer
        (sig(1, util=0.0, in_flight=2), Counters(0, 1), "scale_down", 0),
    ],
)
def test_a_pool_step_aims_at_one_daemon_more_or_one_fewer(
    signals: Signals, counters: Counters, action: str, target: int
) -> None:
    decision = decide(pwt(), signals, counters)
    assert (decision.action, decision.target) == (action, target)


@pytest.mark.parametrize(
    ("signals", "counters"),
    [
        (sig(1, util=0.5), Counters()),  # dead band
        (sig(1, util=0.9), Counters()),  # warming up
        (sig(2, util=0.1), Counters()),  # cooling down
    ],
)
def test_a_pool_noop_has_no_target(signals: Signals, counters: Counters) -> None:
    assert decide(pwt(), signals, counters).target is None


def test_formatting_shows_at_most_six_decimals() -> None:
    decision = decide(pwt(), sig(1, util=0.7999999), Counters())
    assert decision.reason == (
        "utilization 0.800000 between 0.300000 and 0.800000 (dead band): counters reset"
    )
    decision = decide(pwt(), sig(1, util=0.79999), Counters())
    assert decision.reason.startswith("utilization 0.79999 between 0.30000 and 0.80000 ")


@pytest.mark.parametrize(
    ("answer", "policy", "signals", "rule", "bound", "hint"),
    [
        ("scale_up", fe(max=4), sig(3, in_flight=1), "custom_scaler.at_max", "max",
         "raise max above 4"),
        ("scale_down", fe(min=2), sig(2), "custom_scaler.at_min", "min", "lower min below 2"),
        ("bogus", fe(), sig(), "custom_scaler.invalid", None,
         'the scaler must return "scale_up", "scale_down", "tick_noop" '
         'or {"action": …, "reason": …}'),
    ],
)  # fmt: skip
def test_a_scaler_noop_names_its_rule_and_what_to_change(
    answer: object, policy: Policy, signals: Signals, rule: str, bound: str | None, hint: str
) -> None:
    decision = interpret_scaler_answer(answer, policy, signals)
    assert decision == Decision("tick_noop", decision.reason, Counters(), rule, None, bound, hint)


def test_a_failing_scaler_says_it_is_called_again() -> None:
    decision = scaler_failed("boom")
    assert decision.counters == Counters()
    assert decision.hint == "fix the custom scaler; it is called again on the next tick"


@pytest.mark.parametrize(
    ("length", "shown"), [(499, "x" * 499), (500, "x" * 500), (501, "x" * 500 + "…")]
)
def test_a_scalers_text_is_quoted_up_to_500_characters(length: int, shown: str) -> None:
    assert scaler_failed("x" * length).reason == f"custom scaler failed: {shown} — no-op"


# --- reservedSlots: headroom kept free above demand ----------------------------------------


def reserved(policy: Policy, slots: int, per_daemon: int = 1) -> Policy:
    return replace(policy, reserved_slots=slots, slots_per_daemon=per_daemon)


def slots(
    daemons: int, capacity: int, running: int, util: float = 0.0, in_flight: int = 0
) -> Signals:
    return Signals(daemons, util, 0, in_flight, capacity=capacity, running=running)


@pytest.mark.parametrize(
    ("policy", "pending", "target"),
    [
        (reserved(fe(), 2), 0, 2),  # two one-slot daemons kept free with nothing pending
        (reserved(fe(), 3, per_daemon=2), 1, 3),  # 3 slots = 2 daemons of 2, on top of 1
        (reserved(fe(max=2), 4), 1, 2),  # capped at max
        (reserved(fe(min=3), 1), 0, 3),  # min still floors it
        (reserved(mc(max=5), 2), 2, 4),
        (reserved(mc(), 2), 2, 0),  # max_count's unset max (0) caps the headroom too
        (fe(), 4, 4),  # unset: the spec's target
    ],
)
def test_reserved_slots_add_their_daemons_to_the_target(
    policy: Policy, pending: int, target: int
) -> None:
    assert target_of(policy, pending) == target


def test_a_target_held_under_its_headroom_by_max_says_at_max() -> None:
    decision = decide(reserved(fe(max=2), 4), sig(2, pending=1), Counters())
    assert (decision.action, decision.rule, decision.blocked_by) == (
        "tick_noop",
        "fully_elastic.at_max",
        "max",
    )


HEADROOM_RULES = [
    pytest.param(
        reserved(pwt(), 2, per_daemon=2), slots(1, 2, 1, util=0.5), Counters(), "scale_up",
        "headroom", "headroom: 1 free slot (booting included) < reservedSlots 2 → launch",
        id="fewer free slots than reserved launches",
    ),
    pytest.param(
        reserved(pwt(), 2, per_daemon=2), slots(1, 2, 1, util=0.5, in_flight=1), Counters(),
        "tick_noop", "dead_band",
        "utilization 0.50 between 0.30 and 0.80 (dead band): counters reset",
        id="a launch in flight counts its slots",
    ),
    pytest.param(
        reserved(pwt(), 2, per_daemon=2), slots(2, 4, 0), Counters(0, 1), "scale_down",
        "scale_down", "utilization 0.00 <= 0.30 for 2 ticks → kill one",
        id="a kill that keeps the headroom goes ahead",
    ),
    pytest.param(
        reserved(pwt(), 2, per_daemon=2), slots(2, 4, 1, util=0.25), Counters(0, 1), "tick_noop",
        "at_headroom",
        "headroom: utilization 0.25 <= 0.30 for 2 ticks, but one daemon fewer would leave "
        "1 free slot < reservedSlots 2",
        id="a kill that would eat the headroom is a no-op",
    ),
    pytest.param(
        reserved(pwt(max=1), 4), slots(1, 1, 1, util=1.0), Counters(), "tick_noop",
        "warming_up", "utilization 1.00 >= 0.80 for 1 tick (needs 2)",
        id="never past max",
    ),
    pytest.param(
        pwt(), slots(1, 2, 2, util=1.0), Counters(), "tick_noop", "warming_up",
        "utilization 1.00 >= 0.80 for 1 tick (needs 2)", id="unset: the spec's rules",
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("policy", "signals", "before", "action", "rule", "reason"), HEADROOM_RULES
)
def test_reserved_slots_are_a_floor_for_pool_with_threshold(
    policy: Policy, signals: Signals, before: Counters, action: str, rule: str, reason: str
) -> None:
    decision = decide(policy, signals, before)
    assert (decision.action, decision.rule) == (action, f"pool_with_threshold.{rule}")
    assert decision.reason == reason


def test_a_policy_reads_reserved_slots_and_the_template_capacity() -> None:
    spec = QueueSpec.model_validate(
        {
            "name": "q",
            "reservedSlots": 5,
            "daemonTemplate": {"capacity": 2},
            "elasticity": {"kind": "fully_elastic"},
        }
    )
    policy = Policy.from_spec(spec)
    assert (policy.reserved_slots, policy.slots_per_daemon, policy.headroom) == (5, 2, 3)
    assert Policy.from_spec(QueueSpec.model_validate({"name": "q"})).headroom == 0
