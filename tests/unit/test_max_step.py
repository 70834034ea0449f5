"""``max_step``: how many launches (or kills) one tick may make for a scope. Unset it is
1, the spec's rule, word for word; set, the demand policies step that far at once."""

from __future__ import annotations

from typing import Any

import pytest

from lakeshore.domain.queue import Elasticity
from lakeshore.domain.scaling import Counters, Policy, Signals, decide


def sig(daemons: int = 0, util: float = 0.0, pending: int = 0, in_flight: int = 0) -> Signals:
    return Signals(daemon_count=daemons, utilization=util, pending=pending, in_flight=in_flight)


def policy(kind: str, **fields: Any) -> Policy:
    return Policy.from_elasticity(Elasticity(kind=kind, **fields))


@pytest.mark.parametrize(
    ("kind", "fields", "signals", "action", "count", "reason"),
    [
        # unset: one a tick, the spec's words
        (
            "fully_elastic",
            {"max": 32},
            sig(pending=100),
            "scale_up",
            1,
            "target 32 > daemons 0 + in flight 0 → launch",
        ),
        (
            "fully_elastic",
            {"max": 32, "max_step": 8},
            sig(pending=100),
            "scale_up",
            8,
            "target 32 > daemons 0 + in flight 0 → launch 8",
        ),
        # fewer wanted than the step: as many as wanted
        (
            "fully_elastic",
            {"max": 32, "max_step": 8},
            sig(daemons=1, pending=4, in_flight=1),
            "scale_up",
            2,
            "target 4 > daemons 1 + in flight 1 → launch 2",
        ),
        ("max_count", {"max": 4, "max_step": 8}, sig(pending=9), "scale_up", 4, None),
        # kills step too, never below the target or min
        (
            "fully_elastic",
            {"min": 1, "max_step": 3},
            sig(daemons=10),
            "scale_down",
            3,
            "daemons 10 > target 1 and > min 1 → kill 3",
        ),
        ("fully_elastic", {"min": 1, "max_step": 30}, sig(daemons=10), "scale_down", 9, None),
        (
            "fully_elastic",
            {"min": 1},
            sig(daemons=10),
            "scale_down",
            1,
            "daemons 10 > target 1 and > min 1 → kill one",
        ),
        # pool_with_threshold: below min, up to min at once; after its window, a step
        (
            "pool_with_threshold",
            {"min": 4, "max": 8, "max_step": 8},
            sig(daemons=1),
            "scale_up",
            3,
            "below min (4): daemons 1 + in flight 0 → launch 3",
        ),
        ("pool_with_threshold", {"min": 4, "max": 8}, sig(daemons=1), "scale_up", 1, None),
    ],
)
def test_a_step_launches_or_kills_at_most_max_step(
    kind: str,
    fields: dict[str, Any],
    signals: Signals,
    action: str,
    count: int,
    reason: str | None,
) -> None:
    decision = decide(policy(kind, **fields), signals, Counters())
    assert (decision.action, decision.count) == (action, count)
    if reason is not None:
        assert decision.reason == reason


def test_a_pool_past_its_window_steps_up_to_max_and_down_to_min() -> None:
    up = policy("pool_with_threshold", min=1, max=6, max_step=4)
    hot = decide(up, sig(daemons=4, util=0.95), Counters(above=1))
    assert (hot.action, hot.count, hot.target) == ("scale_up", 2, 6)  # max holds the step
    cold = decide(up, sig(daemons=4, util=0.1), Counters(below=1))
    assert (cold.action, cold.count, cold.target) == ("scale_down", 3, 1)  # min holds it


def test_unset_max_step_is_one_and_wait_target_unlimited() -> None:
    assert policy("fully_elastic").max_step == 1
    assert policy("pool_with_threshold").max_step == 1
    assert policy("wait_target", wait_s=60).max_step is None
    assert policy("wait_target", wait_s=60, max_step=5).max_step == 5
