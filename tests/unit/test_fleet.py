"""Scale-down victims, pool grouping and aggregation, and the launch body."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lakeshore.domain.fleet import (
    LaunchBody,
    QueueView,
    WorkerView,
    aggregate,
    cost_weight,
    is_idle,
    launch_body,
    membership,
    partition,
    pick_victim,
    pool_audit_name,
    pool_disagreements,
    pool_launch_source,
    pool_membership,
    pool_policy,
    provider_name,
    victim_order,
)
from lakeshore.domain.queue import DaemonTemplate, Queue, QueueSpec
from lakeshore.domain.scaling import Policy

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def worker(
    id: str,
    *,
    tags: tuple[str, ...] = (),
    weight: float | None = None,
    current: int | None = None,
    running: int = 0,
    seen: int = 0,
) -> WorkerView:
    return WorkerView(
        id=id,
        tags=tags,
        cost_weight=weight,
        current_invocations=current,
        running=running,
        last_seen_at=T0 + timedelta(seconds=seen),
    )


def queue(name: str, *, created: int = 0, **fields: Any) -> QueueView:
    spec = QueueSpec.model_validate({"name": name, **fields})
    return QueueView(id=f"q_{name}", spec=spec, created_at=T0 + timedelta(seconds=created))


def pooled(name: str, pool: str, *, created: int = 0, **elasticity: Any) -> QueueView:
    kind = elasticity.pop("kind", "fully_elastic")
    return queue(name, created=created, elasticity={"kind": kind, "pool": pool, **elasticity})


# --- idle and cost -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("running", "current", "idle"),
    [
        (0, None, True),  # no report: the server's count says idle
        (0, 0, True),
        (1, None, False),
        (0, 2, False),  # the daemon reports work in progress
        (1, 0, False),  # the daemon says 0 but the server holds a running lease: busy
    ],
)
def test_idle_needs_no_running_lease_and_no_reported_work(
    running: int, current: int | None, idle: bool
) -> None:
    assert is_idle(worker("w", running=running, current=current)) is idle


@pytest.mark.parametrize(
    ("tags", "weight", "expected"),
    [
        ((), None, 1.0),
        (("gpu:h100",), None, 10.0),
        (("region:eu", "gpu:a10"), None, 10.0),
        (("gpu",), None, 1.0),  # not a gpu:* tag
        (("cpu:gpu:x",), None, 1.0),
        (("gpu:h100",), 3.5, 3.5),  # a reported weight wins
        ((), 0.0, 0.0),  # even a zero one
    ],
)
def test_cost_weight(tags: tuple[str, ...], weight: float | None, expected: float) -> None:
    assert cost_weight(worker("w", tags=tags, weight=weight)) == expected


# --- victim order ------------------------------------------------------------------------


def test_victims_are_idle_costliest_then_oldest_then_by_id() -> None:
    workers = [
        worker("cpu-old", seen=0),
        worker("gpu-new", tags=("gpu:h100",), seen=50),
        worker("gpu-busy", tags=("gpu:h100",), running=1, seen=0),
        worker("gpu-old", tags=("gpu:h100",), seen=10),
        worker("heavy", weight=20.0, seen=90),
        worker("reported-busy", weight=99.0, current=1),
        worker("b-tie", seen=5),
        worker("a-tie", seen=5),
    ]
    order = [w.id for w in victim_order(workers)]
    assert order == ["heavy", "gpu-old", "gpu-new", "cpu-old", "a-tie", "b-tie"]
    victim = pick_victim(workers)
    assert victim is not None and victim.id == "heavy"


@pytest.mark.parametrize(
    "workers", [[], [worker("a", running=1), worker("b", current=3), worker("c", running=2)]]
)
def test_no_victim_when_nobody_is_idle(workers: list[WorkerView]) -> None:
    assert victim_order(workers) == []
    assert pick_victim(workers) is None


WORKERS = st.lists(
    st.builds(
        worker,
        st.text("abcdef", min_size=1, max_size=3),
        tags=st.lists(st.sampled_from(["gpu:h100", "gpu:a10", "cpu", "region:eu"])).map(tuple),
        weight=st.none() | st.floats(0, 50),
        current=st.none() | st.integers(0, 3),
        running=st.integers(0, 2),
        seen=st.integers(0, 100),
    ),
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(workers=WORKERS)
def test_a_busy_worker_is_never_chosen(workers: list[WorkerView]) -> None:
    victim = pick_victim(workers)
    idle = [w for w in workers if w.running == 0 and not w.current_invocations]
    if not idle:
        assert victim is None
        return
    assert victim is not None
    assert victim.running == 0 and victim.current_invocations in (None, 0)
    assert cost_weight(victim) == max(cost_weight(w) for w in idle)  # cost first
    peers = [w for w in idle if cost_weight(w) == cost_weight(victim)]
    assert victim.last_seen_at == min(w.last_seen_at for w in peers)  # then oldest
    assert sorted(w.id for w in victim_order(workers)) == sorted(w.id for w in idle)


# --- pools -------------------------------------------------------------------------------


def test_partition_splits_standalone_queues_from_pools() -> None:
    queues = [
        queue("solo-b"),
        pooled("gpu-late", "gpu", created=30, max=4),
        pooled("cpu-1", "cpu", created=5),
        queue("solo-a"),
        pooled("gpu-b", "gpu", created=10, max=8),
        pooled("gpu-a", "gpu", created=10, max=9),
    ]
    standalone, pools = partition(queues)
    assert [q.name for q in standalone] == ["solo-b", "solo-a"]  # input order
    assert list(pools) == ["cpu", "gpu"]
    assert [q.name for q in pools["gpu"]] == ["gpu-a", "gpu-b", "gpu-late"]  # created, name
    assert pool_policy(pools["gpu"]) == Policy("fully_elastic", max=9)  # the first member's


def test_partition_of_nothing() -> None:
    assert partition([]) == ([], {})


def test_pool_audit_rows_use_the_pool_name() -> None:
    assert pool_audit_name("gpu-fleet") == "pool:gpu-fleet"


def test_pool_disagreements_name_the_members_that_differ() -> None:
    members = [
        pooled("a", "p", max=4),
        pooled("b", "p", max=4),
        pooled("c", "p", kind="max_count", max=4),
        pooled("d", "p", max=6, min=1),
    ]
    assert pool_disagreements(members) == [
        'queue "c" declares kind=max_count min=0 max=4; the pool follows "a" '
        "(kind=fully_elastic min=0 max=4)",
        'queue "d" declares kind=fully_elastic min=1 max=6; the pool follows "a" '
        "(kind=fully_elastic min=0 max=4)",
    ]
    assert pool_disagreements(members[:2]) == []


def test_a_pool_without_members_has_no_policy() -> None:
    with pytest.raises(ValueError, match="at least one member"):
        pool_policy([])


def test_aggregate_sums_pending_and_counts_each_worker_once() -> None:
    members = [pooled("a", "p"), pooled("b", "p"), pooled("c", "p")]
    shared, only_a, only_b = worker("w-shared"), worker("w-a"), worker("w-b")
    pending, workers = aggregate(
        {"a": 3, "b": 4, "outsider": 100},  # "c" has none recorded
        {"a": [only_a, shared], "b": [shared, only_b], "outsider": [worker("w-x")]},
        members,
    )
    assert pending == 7
    assert [w.id for w in workers] == ["w-a", "w-shared", "w-b"]


def test_a_queue_view_comes_from_a_stored_queue() -> None:
    spec = QueueSpec.model_validate({"name": "q", "elasticity": {"kind": "max_count", "pool": "p"}})
    stored = Queue(
        id="q_1", namespace_id="ns", spec=spec, state="active", created_at=T0, updated_at=T0
    )
    view = QueueView.from_queue(stored)
    assert (view.id, view.name, view.pool, view.created_at) == ("q_1", "q", "p", T0)
    assert view.policy == Policy("max_count")
    assert queue("plain").pool is None


# --- launch ------------------------------------------------------------------------------


def template(**fields: Any) -> DaemonTemplate:
    return DaemonTemplate.model_validate(fields)


def test_a_launch_without_a_template_takes_the_defaults() -> None:
    assert launch_body(None, ["train"]) == LaunchBody(
        queues=("train",),
        runners=("process",),
        capacity=1,
        cloud_tags={},
        bootstrap_script=None,
        setup_commands=(),
        instance_type=None,
        image_id=None,
    )


def test_a_launch_carries_the_whole_template() -> None:
    body = launch_body(
        template(
            instance_type="p5.48xlarge",
            image_id="ami-123",
            runners=["docker", "process"],
            runner="ignored",
            capacity=8,
            cloudTags={"team": "ml"},
            bootstrap_script="#!/bin/sh\necho hi",
            setup_scripts=["pip install torch", "nvidia-smi"],
            provider="ec2-h100",
        ),
        ["a", "b"],
    )
    assert body == LaunchBody(
        queues=("a", "b"),
        runners=("docker", "process"),
        capacity=8,
        cloud_tags={"team": "ml"},
        bootstrap_script="#!/bin/sh\necho hi",
        setup_commands=("pip install torch", "nvidia-smi"),
        instance_type="p5.48xlarge",
        image_id="ami-123",
    )


@pytest.mark.parametrize(
    ("fields", "runners"),
    [
        ({"runners": ["docker"], "runner": "process"}, ("docker",)),
        ({"runner": "docker"}, ("docker",)),
        ({"runners": [], "runner": "docker"}, ("docker",)),  # empty list counts as unset
        ({}, ("process",)),
        ({"runners": []}, ("process",)),
    ],
)
def test_runners_fall_back_to_runner_then_process(
    fields: dict[str, Any], runners: tuple[str, ...]
) -> None:
    assert launch_body(template(**fields), []).runners == runners


def test_capacity_defaults_to_one() -> None:
    assert launch_body(template(runner="docker"), []).capacity == 1
    assert launch_body(template(capacity=4), []).capacity == 4


@pytest.mark.parametrize(
    ("name", "expected"), [("default", []), ("train", ["train"]), ("default-2", ["default-2"])]
)
def test_membership_of_one_queue(name: str, expected: list[str]) -> None:
    assert membership(name) == expected


def test_a_pool_launch_joins_every_member() -> None:
    _, pools = partition([pooled("b", "p", created=2), pooled("a", "p", created=1)])
    assert pool_membership(pools["p"]) == ["a", "b"]


@pytest.mark.parametrize(
    ("fields", "provider"),
    [
        ({"providerRef": "ec2", "daemonTemplate": {"provider": "kube"}}, "ec2"),
        ({"daemonTemplate": {"provider": "kube"}}, "kube"),
        ({"daemonTemplate": {"runner": "docker"}}, None),
        ({}, None),
    ],
)
def test_provider_ref_wins_over_the_template(fields: dict[str, Any], provider: str | None) -> None:
    assert provider_name(QueueSpec.model_validate({"name": "q", **fields})) == provider


def test_a_pool_launches_through_its_first_member_with_a_provider() -> None:
    first = pooled("a", "p", created=1)
    second = queue("b", created=2, providerRef="ec2", elasticity={"kind": "fixed", "pool": "p"})
    third = queue("c", created=3, providerRef="kube", elasticity={"kind": "fixed", "pool": "p"})
    assert pool_launch_source([first, second, third]) is second
    assert pool_launch_source([first]) is first  # none has one: the first, for its reason


def test_a_second_member_that_differs_is_named() -> None:
    members = [pooled("a", "p", max=4), pooled("b", "p", max=5)]
    assert pool_disagreements(members) == [
        'queue "b" declares kind=fully_elastic min=0 max=5; the pool follows "a" '
        "(kind=fully_elastic min=0 max=4)"
    ]
    assert pool_disagreements([]) == []


@pytest.mark.parametrize("rule", [pool_policy, pool_launch_source])
def test_an_empty_pool_is_refused_in_words(rule: Any) -> None:
    with pytest.raises(ValueError, match=r"^a pool has at least one member queue$"):
        rule([])
