"""The ``wait_target`` policy through the plan, as tables: a snapshot and a history in,
a step out. The clock is given (the plan is dated by it); nothing here sleeps."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from lakeshore.domain import wait_target
from lakeshore.domain.fleet import WorkerView
from lakeshore.domain.queue import Queue, parse_spec
from lakeshore.domain.scaling import Policy, Signals
from lakeshore.domain.wait_target import TIMES
from lakeshore.elasticity import estimates, plan
from lakeshore.elasticity.estimates import History
from lakeshore.elasticity.snapshot import Snapshot

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
NS = "ns_1"


def queue(name: str = "gpu", created: int = 0, **elasticity: Any) -> Queue:
    spec = parse_spec(
        {
            "name": name,
            "providerRef": "fk",
            "elasticity": {"kind": "wait_target", "wait_s": 60, "max": 32, **elasticity},
        }
    )
    at = NOW - timedelta(days=1) + timedelta(seconds=created)
    return Queue(
        id=f"q_{name}", namespace_id=NS, spec=spec, state="active", created_at=at, updated_at=at
    )


def worker(wid: str, running: int = 0) -> WorkerView:
    return WorkerView(
        id=wid,
        tags=(),
        cost_weight=None,
        current_invocations=running,
        running=running,
        last_seen_at=NOW,
    )


def step_of(
    queues: list[Queue],
    *,
    pending: int = 0,
    workers: list[WorkerView] = (),  # type: ignore[assignment]
    in_flight: int = 0,
    history: History | None = None,
    scope: str | None = None,
) -> plan.Step:
    key = (NS, scope or queues[0].name)
    snap = Snapshot(
        queues=[("default", q) for q in queues],
        pending={queues[0].id: pending},
        running={queues[0].id: sum(w.running for w in workers)},
        workers={q.id: list(workers) for q in queues},
        capacity={w.id: 1 for w in workers},
        counters={},
        in_flight={key: in_flight},
        history={key: history} if history is not None else {},
    )
    (step,) = plan.plan(snap, NOW)
    return step


def test_with_no_history_it_reads_its_hints_and_the_defaults_and_bursts() -> None:
    step = step_of([queue(service_s=45)], pending=100)
    est = step.decision.estimates
    assert est is not None
    assert est["service_s"] == {"value": 45.0, "source": "hint", "samples": 0}
    assert est["boot_s"]["source"] == "default"
    assert est["arrivals_per_s"]["source"] == "learned"
    assert step.action == "scale_up"
    assert step.launch is not None and step.launch.count == step.decision.count > 1
    assert step.decision.reason.startswith(f"launch {step.decision.count}: backlog 100 ")
    assert "with 0 daemons would never start its last; " in step.decision.reason
    assert est["p95_wait_s_without"] is None  # no fleet: the backlog never starts
    assert est["p95_wait_s_with"] is not None


@pytest.mark.parametrize(
    ("history", "expected"),
    [
        (History(), {"service_s": "default", "boot_s": "default"}),
        (History(service_s=[30.0, 50.0]), {"service_s": "learned", "boot_s": "default"}),
        (History(boot_s=[100.0]), {"service_s": "default", "boot_s": "learned"}),
    ],
)
def test_each_estimate_says_where_it_came_from(history: History, expected: dict[str, str]) -> None:
    est = step_of([queue()], pending=5, history=history).decision.estimates
    assert est is not None
    assert {name: est[name]["source"] for name in expected} == expected


def test_a_hint_gives_way_to_enough_learned_samples() -> None:
    policy = Policy("wait_target", wait_s=60, service_s=45)
    assert estimates.service_of(policy, [10.0, 20.0]).source == "hint"
    learned = estimates.service_of(policy, [10.0, 20.0, 30.0])
    assert (learned.value, learned.source, learned.samples) == (20.0, "learned", 3)


def test_a_scope_at_max_waits_and_names_the_bound() -> None:
    step = step_of([queue(max=2)], pending=50, workers=[worker("w1", 1), worker("w2", 1)])
    assert step.action == "tick_noop"
    assert step.decision.rule == "wait_target.at_max"
    assert step.decision.blocked_by == "max"
    assert step.decision.reason.startswith("at max (2): ")


def test_a_backlog_the_present_fleet_drains_before_a_boot_ends_launches_nothing() -> None:
    # 10 waiting, 4 idle daemons of 30 s service: 4 start now, the last within 45 s,
    # before any new daemon would boot (100 s); over the 20 s target, but a launch would
    # not help
    workers = [worker(f"w{i}") for i in range(4)]
    history = History(service_s=[30.0] * 5, boot_s=[100.0], idle_for={})
    step = step_of([queue(wait_s=20)], pending=10, workers=workers, history=history)
    assert step.action == "tick_noop"
    assert step.decision.rule == "wait_target.drains_first"


def test_a_backlog_that_outlasts_a_boot_launches_enough_at_once() -> None:
    # 180 waiting, 2 busy daemons of 45 s service, boot 120 s: the last would start in
    # over an hour; launches start it within a service time of the boot
    history = History(service_s=[45.0] * 10, boot_s=[120.0])
    workers = [worker("w1", 1), worker("w2", 1)]
    step = step_of([queue(wait_s=300, max=64)], pending=180, workers=workers, history=history)
    assert (step.action, step.decision.count) == ("scale_up", 34)
    assert step.decision.reason.startswith(
        f"launch 34: backlog 180 {TIMES} 45 s with 2 daemons would start its last in 67 min; "
        "36 daemons, booting in ~2 min, start it within 5 min"
    )
    est = step.decision.estimates
    assert est is not None and est["p95_wait_s_with"] <= 300 < est["p95_wait_s_without"]


def test_max_step_caps_the_burst() -> None:
    step = step_of([queue(max_step=3)], pending=100)
    assert (step.action, step.decision.count) == ("scale_up", 3)


@pytest.mark.parametrize(("idle_s", "killed"), [(30.0, 0), (59.0, 0), (61.0, 1), (600.0, 1)])
def test_a_gap_shorter_than_a_boot_kills_nothing(idle_s: float, killed: int) -> None:
    history = History(boot_s=[60.0], idle_for={"w1": idle_s})
    step = step_of([queue()], workers=[worker("w1")], history=history)
    assert len(step.victims) == killed
    assert step.action == ("scale_down" if killed else "tick_noop")


def test_it_kills_only_the_daemons_idle_longer_than_a_boot_and_keeps_the_steady_need() -> None:
    # 2 per minute of 30 s service: one daemon holds p95 under 60 s? no: two are needed
    history = History(
        service_s=[30.0] * 10,
        boot_s=[60.0],
        per_minute=[2] * 20,
        idle_for={"w1": 600.0, "w2": 10.0, "w3": 600.0, "w4": 600.0},
    )
    workers = [worker(f"w{i}") for i in range(1, 5)]
    step = step_of([queue()], workers=workers, history=history)
    need = step.decision.estimates["steady_need"]  # type: ignore[index]
    assert step.action == "scale_down"
    assert "w2" not in step.victims  # idle for less than a boot
    assert len(step.victims) == 4 - need


def test_delayed_work_due_within_a_boot_counts_as_demand_now() -> None:
    idle = step_of([queue()], history=History(due_soon=0))
    assert idle.action == "tick_noop"
    due = step_of([queue()], history=History(due_soon=20))
    assert due.action == "scale_up"
    assert due.decision.estimates["due_soon"] == 20  # type: ignore[index]


def test_a_pool_is_one_scope_its_launches_join_every_member() -> None:
    a = queue("a", created=0, pool="gpus")
    b = queue("b", created=1, pool="gpus")
    step = step_of([a, b], pending=40, scope="pool:gpus")
    assert step.key == (NS, "pool:gpus")
    assert step.action == "scale_up"
    assert step.launch is not None and sorted(step.launch.membership) == ["a", "b"]


def test_the_steady_need_follows_erlang_c() -> None:
    # 0.02 a second of 45 s service, p95 under 300 s (sized at 40 % of it): two daemons
    d = wait_target.Demand(
        service=wait_target.Estimate(45.0, "learned"),
        boot=wait_target.Estimate(120.0, "learned"),
        arrivals=wait_target.Estimate(0.02, "learned"),
    )
    assert wait_target.steady_need(Policy("wait_target", wait_s=300), d) == 2
    assert wait_target.p95_steady(1, 0.02, 45.0) > 300 > wait_target.p95_steady(2, 0.02, 45.0)
    assert wait_target.p95_steady(1, 0.03, 45.0) == wait_target.NEVER  # cannot keep up


def test_a_burst_is_backlog_not_a_rate() -> None:
    steady = estimates.arrivals_of([1, 2, 1, 0, 1, 2, 1, 1, 0, 1] * 2)
    burst = estimates.arrivals_of([100, 2, 1, 0, 1, 2, 1, 1, 0, 1, 1, 2, 1, 0, 1, 2, 1, 1, 0, 1])
    assert burst.value == pytest.approx(steady.value, rel=0.1)
    rising = estimates.arrivals_of([12, 11, 13, 12, 12, *([2] * 15)])
    assert rising.value * 60 > 10  # the last minutes show a rise: theirs


def test_the_decision_is_a_function_of_its_inputs() -> None:
    history = History(service_s=[45.0] * 5, boot_s=[120.0], per_minute=[1] * 20)
    one = step_of([queue()], pending=30, history=history)
    two = step_of([queue()], pending=30, history=history)
    assert one.decision == two.decision


def test_signals_unchanged() -> None:  # the signals a wait_target step reports are the tick's
    step = step_of([queue()], pending=7, workers=[worker("w1", 1)], in_flight=2)
    assert step.signals == Signals(
        daemon_count=1, utilization=1.0, pending=7, in_flight=2, capacity=1, running=1
    )
