"""pool_with_threshold's ``reservedSlots`` and ``min`` decisions whole: the target they
aim at (launches in flight counted), the counters they leave (a due window spent by the
launch), the words and the hint; and the slowest ``rate_limit`` a queue may declare."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lakeshore.domain.queue import parse_spec
from lakeshore.domain.scaling import Counters, Decision, Policy, Signals, decide
from lakeshore.errors import InvalidInput

RULE = "pool_with_threshold"


def pool(reserved: int = 0, per_daemon: int = 1, **bounds: int) -> Policy:
    return replace(Policy(RULE, **bounds), reserved_slots=reserved, slots_per_daemon=per_daemon)


def slots(
    daemons: int, capacity: int, running: int, util: float = 0.0, in_flight: int = 0
) -> Signals:
    return Signals(daemons, util, 0, in_flight, capacity=capacity, running=running)


def launch(reason: str, counters: Counters, rule: str, target: int) -> Decision:
    return Decision("scale_up", reason, counters, f"{RULE}.{rule}", target)


DECISIONS = [
    pytest.param(
        pool(4, per_daemon=2), slots(1, 2, 1, util=0.5, in_flight=1), Counters(),
        launch("headroom: 3 free slots (booting included) < reservedSlots 4 → launch",
               Counters(0, 0), "headroom", 3),
        id="headroom: one more than the daemons and those booting",
    ),
    pytest.param(
        pool(1), slots(1, 1, 1, util=1.0), Counters(),
        launch("headroom: 0 free slots (booting included) < reservedSlots 1 → launch",
               Counters(1, 0), "headroom", 2),
        id="headroom: a window not yet due is kept",
    ),
    pytest.param(
        pool(4, per_daemon=2), slots(1, 2, 2, util=1.0), Counters(above=1),
        launch("headroom: 0 free slots (booting included) < reservedSlots 4 → launch",
               Counters(0, 0), "headroom", 2),
        id="headroom: a window due this tick is spent by the launch",
    ),
    pytest.param(
        pool(min=3), slots(1, 1, 0, in_flight=1), Counters(),
        launch("below min (3): daemons 1 + in flight 1 → launch", Counters(0, 1), "below_min", 3),
        id="below min: one more than the daemons and those booting",
    ),
    pytest.param(
        pool(2, per_daemon=2), slots(2, 4, 1, util=0.25), Counters(0, 1),
        Decision(
            "tick_noop",
            "headroom: utilization 0.25 <= 0.30 for 2 ticks, but one daemon fewer would "
            "leave 1 free slot < reservedSlots 2",
            Counters(0, 2),
            f"{RULE}.at_headroom",
            hint="lower reservedSlots below 2 to scale down",
        ),
        id="a kill that would eat the headroom: the window stays due",
    ),
    pytest.param(
        pool(1, per_daemon=2), slots(2, 4, 3, util=0.1), Counters(0, 1),
        Decision(
            "tick_noop",
            "headroom: utilization 0.10 <= 0.30 for 2 ticks, but one daemon fewer would "
            "leave 0 free slots < reservedSlots 1",
            Counters(0, 2),
            f"{RULE}.at_headroom",
            hint="lower reservedSlots below 1 to scale down",
        ),
        id="a kill that would leave fewer than none free says none",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("policy", "signals", "before", "decision"), DECISIONS)
def test_headroom_and_min_decisions_whole(
    policy: Policy, signals: Signals, before: Counters, decision: Decision
) -> None:
    assert decide(policy, signals, before) == decision


@pytest.mark.parametrize("rate", [1e-6, 2.5])
def test_a_rate_limit_of_one_submit_in_eleven_days_or_more_is_taken(rate: float) -> None:
    admission = parse_spec({"name": "q", "admission": {"rate_limit": rate}}).admission
    assert admission is not None and admission.rate_limit == rate


@pytest.mark.parametrize("rate", [9.9e-7, 1e-300])
def test_a_slower_rate_limit_is_refused_with_its_bound(rate: float) -> None:
    with pytest.raises(InvalidInput) as refused:
        parse_spec({"name": "q", "admission": {"rate_limit": rate}})
    assert (refused.value.field, refused.value.message) == (
        "admission.rate_limit",
        "admission.rate_limit: a rate_limit is at least 1e-06 submits a second",
    )
