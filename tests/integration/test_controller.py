"""The elasticity controller through the API: ticks run by hand (POST /v1/admin/elasticity/tick)
with the fake provider and a fake clock, on both stores."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from lakeshore.config import Settings
from lakeshore.providers import LaunchRequest
from lakeshore.providers.fake import FakeProvider
from lakeshore.services.taskqueue import reaper, retention
from lakeshore.store import controller as ctl_store
from lakeshore.store.engine import Store
from lakeshore.store.tables import controller_state, elasticity_events, launches
from tests.conftest import FakeClock
from tests.integration.test_api_auth import namespace_token
from tests.integration.test_api_workers import claim, hello

NS = "/v1/namespaces/default"
W = "/v1/workers"
TICK = "/v1/admin/elasticity/tick"


async def provider(api: httpx.AsyncClient, name: str = "fk", **config: Any) -> None:
    body = {"name": name, "kind": "fake", "config": config}
    response = await api.post(f"{NS}/providers", json=body)
    assert response.status_code == 201, response.text


async def queue(
    api: httpx.AsyncClient, name: str, elasticity: dict[str, Any], **extra: Any
) -> None:
    body = {"name": name, "elasticity": elasticity, **extra}
    response = await api.post(f"{NS}/queues", json=body)
    assert response.status_code == 201, response.text


async def submit_many(api: httpx.AsyncClient, queue_name: str, count: int) -> None:
    items = [{"fn": "tests.udfs:noop"} for _ in range(count)]
    response = await api.post(
        f"{NS}/queues/{queue_name}/invocations/batch", json={"invocations": items}
    )
    assert response.status_code == 201, response.text


async def tick(api: httpx.AsyncClient) -> dict[str, dict[str, Any]]:
    """One tick; its decisions by scope (queue name or pool:<name>)."""
    response = await api.post(TICK)
    assert response.status_code == 200, response.text
    decisions = response.json()["decisions"]
    scopes = [d["scope"] for d in decisions]
    assert len(scopes) == len(set(scopes)), "one decision per queue or pool"
    return {d["scope"]: d for d in decisions}


def elastic(**extra: Any) -> dict[str, Any]:
    return {"kind": "fully_elastic", "min": 0, **extra}


async def test_scale_up_through_the_fake_provider_counts_launches_in_flight(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    await provider(api)
    await queue(api, "up", elastic(max=2), providerRef="fk")
    await submit_many(api, "up", 5)
    first = (await tick(api))["up"]
    assert first["action"] == "scale_up"
    assert first["reason"] == "target 2 > daemons 0 + in flight 0 → launch"
    assert (first["before"]["in_flight"], first["after"]["in_flight"]) == (0, 1)
    second = (await tick(api))["up"]
    assert second["reason"] == "target 2 > daemons 0 + in flight 1 → launch"
    third = (await tick(api))["up"]
    assert third["action"] == "tick_noop"  # two booting: no double spawn
    assert third["before"]["in_flight"] == 2
    launched = (await api.get(f"{NS}/providers/fk/launches")).json()["launches"]
    assert len(launched) == 2
    assert all(launch["body"]["queues"] == ["up"] for launch in launched)
    clock.advance(16)  # the fake provider's TTL (15 s) passes without a hello
    assert (await tick(api))["up"]["action"] == "scale_up"


async def test_a_hello_with_its_launch_id_resolves_the_launch(api: httpx.AsyncClient) -> None:
    await provider(api)
    await queue(api, "boot", elastic(max=1), providerRef="fk")
    await submit_many(api, "boot", 3)
    launch_id = (await tick(api))["boot"]["launch_id"]
    await hello(api, ["boot"], launch_id=launch_id)
    after = (await tick(api))["boot"]
    assert (after["before"]["daemon_count"], after["before"]["in_flight"]) == (1, 0)
    assert after["action"] == "tick_noop"
    state = (await api.get(f"{NS}/providers/fk/launches")).json()["launches"][0]["state"]
    assert state == "succeeded"


async def test_no_provider_is_a_noop_with_the_spec_reason(api: httpx.AsyncClient) -> None:
    await queue(api, "orphan", elastic())
    await submit_many(api, "orphan", 1)
    decision = (await tick(api))["orphan"]
    assert decision["action"] == "tick_noop"
    assert decision["reason"].endswith(
        'queue "orphan" has no providerRef / daemonTemplate.provider — cannot launch'
    )


async def test_an_unregistered_provider_is_a_noop_naming_it(api: httpx.AsyncClient) -> None:
    await queue(api, "ghost", elastic(), daemonTemplate={"provider": "nowhere"})
    await submit_many(api, "ghost", 1)
    decision = (await tick(api))["ghost"]
    assert decision["action"] == "tick_noop"
    assert 'provider "nowhere" is not registered' in decision["reason"]


async def test_a_failing_provider_downgrades_and_frees_the_slot(api: httpx.AsyncClient) -> None:
    await provider(api, fail_launch="quota exceeded")
    await queue(api, "broken", elastic(max=1), providerRef="fk")
    await submit_many(api, "broken", 2)
    decision = (await tick(api))["broken"]
    assert decision["action"] == "tick_noop"
    assert decision["reason"] == (
        "target 1 > daemons 0 + in flight 0 → launch; launch failed: quota exceeded"
    )
    again = (await tick(api))["broken"]
    assert again["before"]["in_flight"] == 0  # resolved at once on failure
    [launch] = (await api.get(f"{NS}/providers/fk/launches")).json()["launches"][:1]
    assert (launch["state"], launch["error"]) == ("failed", "launch failed: quota exceeded")


@pytest.fixture
def settings(settings: Settings) -> Settings:
    # a short provider time-out; and no fallback re-check inside a claim's wait, so only a
    # wake-up can end one early
    return settings.model_copy(update={"elasticity_call_timeout_s": 0.2, "claim_recheck_s": 60})


async def test_a_hung_provider_times_out_into_a_noop(api: httpx.AsyncClient) -> None:
    await provider(api, hang_s=30)
    await queue(api, "slow", elastic(), providerRef="fk")
    await submit_many(api, "slow", 1)
    decision = (await tick(api))["slow"]
    assert decision["action"] == "tick_noop"
    assert decision["reason"].endswith('launch failed: provider "fk" did not answer within 0.2 s')


async def test_scale_down_kills_an_idle_worker_and_its_id_is_refused(
    api: httpx.AsyncClient,
) -> None:
    await queue(api, "down", elastic(min=0))
    worker = await hello(api, ["down"])
    decision = (await tick(api))["down"]
    assert decision["action"] == "scale_down"
    assert decision["reason"] == "daemons 1 > target 0 and > min 0 → kill one"
    assert decision["victim"] == worker
    assert decision["after"]["daemon_count"] == 0
    refused = await api.post(f"{W}/hello", json={"id": worker, "queues": ["down"]})
    assert refused.status_code == 410
    assert (await api.post(f"{W}/{worker}/claim", json={"timeout_s": 0})).status_code == 410
    stats = (await api.get(f"{NS}/queues/down/stats")).json()
    assert stats["daemonCount"] == 0


async def test_a_busy_worker_is_never_killed(api: httpx.AsyncClient) -> None:
    await queue(api, "busy", elastic(min=0, max=1))
    worker = await hello(api, ["busy"], capacity=1)
    await submit_many(api, "busy", 1)
    assert len(await claim(api, worker)) == 1
    await api.patch(f"{NS}/queues/busy", json={"elasticity": elastic(min=0, max=0)})
    decision = (await tick(api))["busy"]
    assert decision["action"] == "tick_noop"
    assert "no idle worker to kill" in decision["reason"]
    assert (await api.post(f"{W}/{worker}/heartbeat")).status_code == 200


async def test_current_invocations_is_read_from_heartbeats_too(api: httpx.AsyncClient) -> None:
    """A daemon that reports what it runs (work the server does not lease to it) on its
    heartbeats is not idle while it says so, and is again once it reports 0."""
    await queue(api, "own", elastic(min=0))
    worker = await hello(api, ["own"])  # says nothing of current_invocations at hello
    busy = {"capabilities": {"current_invocations": 2}}
    assert (await api.post(f"{W}/{worker}/heartbeat", json=busy)).status_code == 200
    kept = (await tick(api))["own"]
    assert kept["action"] == "tick_noop"
    assert "no idle worker to kill" in kept["reason"]
    unsaid = {"running": []}  # a heartbeat without capabilities changes nothing
    assert (await api.post(f"{W}/{worker}/heartbeat", json=unsaid)).status_code == 200
    assert (await tick(api))["own"]["action"] == "tick_noop"
    idle = {"capabilities": {"current_invocations": 0}}
    assert (await api.post(f"{W}/{worker}/heartbeat", json=idle)).status_code == 200
    gone = (await tick(api))["own"]
    assert (gone["action"], gone["victim"]) == ("scale_down", worker)


@pytest.mark.parametrize(
    "capabilities", [{"current_invocations": -1}, {"current_invocations": "2"}, {"cost": 1}]
)
async def test_a_heartbeats_capabilities_are_checked(
    api: httpx.AsyncClient, capabilities: dict[str, Any]
) -> None:
    await queue(api, "own", elastic(min=0))
    worker = await hello(api, ["own"])
    body = {"capabilities": capabilities}
    refused = await api.post(f"{W}/{worker}/heartbeat", json=body)
    assert refused.status_code == 422, refused.text


async def test_the_costliest_then_oldest_idle_worker_goes_first(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    await queue(api, "cost", elastic(min=0))
    cheap_old = await hello(api, ["cost"])
    clock.advance(1)
    gpu = await hello(api, ["cost"], tags=["gpu:a100"])
    clock.advance(1)
    weighted = await hello(api, ["cost"], capabilities={"max_invocations": 1, "cost_weight": 50})
    victims = [(await tick(api))["cost"]["victim"] for _ in range(3)]
    assert victims == [weighted, gpu, cheap_old]


async def test_a_pool_ticks_once_with_summed_pending_and_joins_every_member(
    api: httpx.AsyncClient, store: Store
) -> None:
    await provider(api)
    pooled = elastic(max=10, pool="p")
    await queue(api, "pa", pooled, providerRef="fk")
    await queue(api, "pb", pooled)
    await submit_many(api, "pa", 1)
    await submit_many(api, "pb", 2)
    await hello(api, ["pa", "pb"])  # one worker in both members counts once
    decisions = await tick(api)
    assert set(decisions) == {"pool:p"}
    decision = decisions["pool:p"]
    assert (decision["before"]["pending"], decision["before"]["daemon_count"]) == (3, 1)
    assert decision["reason"] == "target 3 > daemons 1 + in flight 0 → launch"
    launch = (await api.get(f"{NS}/providers/fk/launches")).json()["launches"][0]
    assert launch["body"]["queues"] == ["pa", "pb"]
    assert launch["scope"] == "pool:p"
    async with store.read() as conn:
        names = (await conn.execute(select(elasticity_events.c.queue_name))).scalars().all()
    assert names == ["pool:p"]


async def test_every_active_queue_gets_exactly_one_event_per_tick(
    api: httpx.AsyncClient, store: Store
) -> None:
    await api.post(f"{NS}/queues", json={"name": "still"})  # no elasticity: fixed
    await queue(api, "paused", elastic())
    await api.post(f"{NS}/queues/paused/pause")
    for _ in range(3):
        decisions = await tick(api)
    assert decisions["still"]["reason"] == "fixed: no-op"
    assert "paused" not in decisions
    e = elasticity_events.c
    async with store.read() as conn:
        count = select(e.queue_name, func.count(), func.sum(e.repeats)).group_by(e.queue_name)
        rows = {name: (n, int(ticks)) for name, n, ticks in (await conn.execute(count)).all()}
    # three identical no-ops: one row, decided three times
    assert rows["still"] == (1, 3) and "paused" not in rows


async def test_threshold_counters_are_persisted_between_ticks(
    api: httpx.AsyncClient, store: Store
) -> None:
    await provider(api)
    await queue(api, "hot", {"kind": "pool_with_threshold", "max": 3}, providerRef="fk")
    worker = await hello(api, ["hot"], capacity=1)
    await submit_many(api, "hot", 2)
    assert len(await claim(api, worker)) == 1  # utilization 1.0
    first = (await tick(api))["hot"]
    assert first["action"] == "tick_noop"
    assert first["reason"] == "utilization 1.00 >= 0.80 for 1 tick (needs 2)"
    async with store.read() as conn:
        above = (await conn.execute(select(controller_state.c.consecutive_above))).scalar_one()
    assert above == 1
    second = (await tick(api))["hot"]
    assert second["action"] == "scale_up"
    assert second["reason"] == "utilization 1.00 >= 0.80 for 2 ticks → launch"


async def test_pool_with_threshold_keeps_min_daemons_warm(api: httpx.AsyncClient) -> None:
    """Idle and empty, below min: one launch per tick until daemons + in flight reach min,
    then the hysteresis as before (and never a kill below min)."""
    await provider(api)
    await queue(api, "warm", {"kind": "pool_with_threshold", "min": 2, "max": 4}, providerRef="fk")
    first = (await tick(api))["warm"]
    assert (first["action"], first["rule"]) == ("scale_up", "pool_with_threshold.below_min")
    assert first["reason"] == "below min (2): daemons 0 + in flight 0 → launch"
    second = (await tick(api))["warm"]
    assert second["reason"] == "below min (2): daemons 0 + in flight 1 → launch"
    third = (await tick(api))["warm"]
    assert third["action"] == "tick_noop"  # two booting: min is covered
    launched = (await api.get(f"{NS}/providers/fk/launches")).json()["launches"]
    assert len(launched) == 2
    for launch in launched:
        await hello(api, ["warm"], launch_id=launch["id"])
    for _ in range(3):  # idle at min: no kill, no launch
        steady = (await tick(api))["warm"]
        assert steady["action"] == "tick_noop"
        assert steady["before"]["daemon_count"] == 2


@pytest.mark.parametrize("leave", ["pause", "drain"])
async def test_hysteresis_counters_reset_when_a_queue_leaves_active(
    api: httpx.AsyncClient, store: Store, leave: str
) -> None:
    """A window under way does not survive a pause or a drain: after the resume, the
    first high tick is the first of a new window."""
    await provider(api)
    elasticity = {"kind": "pool_with_threshold", "max": 3}
    await queue(api, "hot", elasticity, providerRef="fk")
    await queue(api, "pooled", {**elasticity, "pool": "gpu"}, providerRef="fk")
    for name in ("hot", "pooled"):
        worker = await hello(api, [name], capacity=1)
        await submit_many(api, name, 2)
        assert len(await claim(api, worker)) == 1  # utilization 1.0
    first = await tick(api)
    assert first["hot"]["reason"] == "utilization 1.00 >= 0.80 for 1 tick (needs 2)"
    assert first["pool:gpu"]["reason"] == "utilization 1.00 >= 0.80 for 1 tick (needs 2)"
    for name in ("hot", "pooled"):
        assert (await api.post(f"{NS}/queues/{name}/{leave}")).status_code == 200
    async with store.read() as conn:
        assert await ctl_store.load_counters(conn) == {}
    for name in ("hot", "pooled"):
        assert (await api.post(f"{NS}/queues/{name}/resume")).status_code == 200
    again = await tick(api)
    assert again["hot"]["action"] == "tick_noop"
    assert again["hot"]["reason"] == "utilization 1.00 >= 0.80 for 1 tick (needs 2)"
    assert again["pool:gpu"]["reason"] == "utilization 1.00 >= 0.80 for 1 tick (needs 2)"


async def test_events_name_what_was_ticked_queue_name_as_the_spec_does(
    api: httpx.AsyncClient,
) -> None:
    await queue(api, "solo", elastic())
    await queue(api, "member", elastic(pool="gpu"))
    decisions = await tick(api)
    assert {d["queueName"] for d in decisions.values()} == {"solo", "pool:gpu"}
    assert all(d["queueName"] == d["scope"] for d in decisions.values())  # the old name
    solo = (await api.get(f"{NS}/queues/solo/events", params={"verbose": "true"})).json()
    member = (await api.get(f"{NS}/queues/member/events", params={"verbose": "true"})).json()
    assert [e["queueName"] for e in solo["events"]] == ["solo"]
    assert [e["queueName"] for e in member["events"]] == ["pool:gpu"]  # the pool's decision
    event = solo["events"][0]
    assert set(event) == {
        "id", "queueName", "scope", "action", "reason", "rule", "hint",
        "before", "after", "detail", "createdAt", "repeats", "lastAt",
    }  # fmt: skip
    assert set(event["before"]) == {"daemon_count", "utilization", "pending", "in_flight"}


async def test_reserved_slots_keep_daemons_free_above_demand(api: httpx.AsyncClient) -> None:
    """reservedSlots is headroom: with nothing pending, a fully_elastic queue keeps as many
    daemons as hold that many slots; a pool_with_threshold queue launches when fewer
    slots than reserved are free, and keeps them at scale-down."""
    await provider(api)
    await queue(api, "spare", elastic(), providerRef="fk", reservedSlots=2)
    first = (await tick(api))["spare"]
    assert first["reason"] == "target 2 > daemons 0 + in flight 0 → launch"
    template = {"capacity": 2}
    await queue(
        api,
        "warm",
        {"kind": "pool_with_threshold", "max": 4},
        providerRef="fk",
        reservedSlots=2,
        daemonTemplate=template,
    )
    worker = await hello(api, ["warm"], capacity=2)
    assert (await tick(api))["warm"]["action"] == "tick_noop"  # 2 free: the headroom holds
    await submit_many(api, "warm", 1)
    assert len(await claim(api, worker)) == 1
    short = (await tick(api))["warm"]
    assert (short["action"], short["rule"]) == ("scale_up", "pool_with_threshold.headroom")
    assert short["reason"] == "headroom: 1 free slot (booting included) < reservedSlots 2 → launch"
    booting = (await tick(api))["warm"]
    assert booting["action"] == "tick_noop"  # the launch in flight brings 2 slots
    explained = (await api.get(f"{NS}/queues/warm/explain")).json()
    assert explained["policy"]["reservedSlots"] == 2


async def test_a_queue_pinned_to_another_node_is_not_ticked(api: httpx.AsyncClient) -> None:
    await queue(api, "elsewhere", elastic(), serverNodeId="node-b")
    await queue(api, "here", elastic())
    decisions = await tick(api)
    assert "elsewhere" not in decisions and "here" in decisions


async def test_a_patch_takes_effect_on_the_next_tick(api: httpx.AsyncClient) -> None:
    await provider(api)
    await queue(api, "knob", elastic(max=0), providerRef="fk")
    await submit_many(api, "knob", 2)
    assert (await tick(api))["knob"]["action"] == "tick_noop"
    patched = await api.patch(f"{NS}/queues/knob", json={"elasticity": elastic(max=1)})
    assert patched.status_code == 200
    assert (await tick(api))["knob"]["action"] == "scale_up"


async def test_only_the_admin_may_tick(api: httpx.AsyncClient) -> None:
    headers = await namespace_token(api, "team")
    refused = await api.post(TICK, headers=headers)
    assert refused.status_code == 403


async def test_launches_are_recorded_before_the_provider_is_called(
    api: httpx.AsyncClient, store: Store, clock: FakeClock
) -> None:
    """A launch row exists with its TTL, so a crash mid-call still holds the slot."""
    await provider(api, launch_ttl_s=120)
    await queue(api, "ttl", elastic(max=1), providerRef="fk")
    await submit_many(api, "ttl", 1)
    await tick(api)
    async with store.read() as conn:
        row = (await conn.execute(select(launches))).mappings().one()
    assert row["expires_at"] - row["created_at"] == timedelta(seconds=120)
    assert row["handle"] == {"fake": row["id"]}


# --- custom scalers --------------------------------------------------------------------


async def test_only_allowed_scalers_may_be_named(api: httpx.AsyncClient) -> None:
    refused = await api.post(f"{NS}/queues", json={"name": "evil", "customScalerUdf": "os:system"})
    assert refused.status_code == 422
    assert refused.json()["error"]["field"] == "customScalerUdf"
    assert "LAKESHORE_ALLOWED_SCALERS" in refused.json()["error"]["message"]
    await api.post(f"{NS}/queues", json={"name": "later"})
    patched = await api.patch(f"{NS}/queues/later", json={"customScalerUdf": "os:system"})
    assert patched.status_code == 422


@pytest.mark.parametrize(
    ("path", "action", "reason"),
    [
        (
            "tests.udfs:scaler_up",
            "scale_up",
            "custom scaler answered scale_up: asked with pending 2",
        ),
        ("tests.udfs:scaler_raises", "tick_noop", "scaler exploded"),
        ("tests.udfs:scaler_hangs", "tick_noop", "did not answer within 0.2 s"),
        ("tests.udfs:scaler_garbage", "tick_noop", "custom scaler answer ignored"),
    ],
)
async def test_a_custom_scaler_decides_and_its_failures_are_noops(
    api: httpx.AsyncClient, path: str, action: str, reason: str
) -> None:
    await provider(api)
    await queue(api, "custom", elastic(max=5), providerRef="fk", customScalerUdf=path)
    await submit_many(api, "custom", 2)
    decision = (await tick(api))["custom"]
    assert decision["action"] == action
    assert reason in decision["reason"]


async def test_ssh_and_slurm_register_and_are_refused_at_launch(api: httpx.AsyncClient) -> None:
    for kind in ("ssh", "slurm"):
        body = {"name": kind, "kind": kind, "config": {"host": "x"}}
        assert (await api.post(f"{NS}/providers", json=body)).status_code == 201
        await queue(api, f"via-{kind}", elastic(), providerRef=kind)
        await submit_many(api, f"via-{kind}", 1)
    decisions = await tick(api)
    for kind in ("ssh", "slurm"):
        decision = decisions[f"via-{kind}"]
        assert decision["action"] == "tick_noop"
        assert (
            f"is of kind {kind}, which Lakeshore registers but cannot launch"
            in (decision["reason"])
        )


async def test_old_noops_are_pruned_and_decisions_that_acted_are_kept(
    api: httpx.AsyncClient, store: Store, clock: FakeClock
) -> None:
    await queue(api, "old", elastic())
    await hello(api, ["old"])
    await tick(api)  # scale_down
    await tick(api)  # no-op
    clock.advance(86_400 + 61)
    windows = retention.Windows(noop_retention_s=86_400)  # acted: a week; no-ops: a day
    assert (await retention.sweep(store, clock(), windows)).events == 1
    await tick(api)  # a no-op of its own
    async with store.read() as conn:
        actions = (
            (
                await conn.execute(
                    select(elasticity_events.c.action).order_by(elasticity_events.c.id)
                )
            )
            .scalars()
            .all()
        )
    assert actions == ["scale_down", "tick_noop"]


async def test_a_waiting_claim_of_a_retired_worker_answers_410(api: httpx.AsyncClient) -> None:
    """The retirement wakes the worker's long-poll, so its daemon learns at once."""
    await queue(api, "bye", elastic(min=0))
    worker = await hello(api, ["bye"])
    waiting = asyncio.create_task(api.post(f"{W}/{worker}/claim", json={"timeout_s": 15}))
    await asyncio.sleep(0.05)  # let the claim start waiting
    assert (await tick(api))["bye"]["victim"] == worker
    answer = await asyncio.wait_for(waiting, timeout=10)
    assert answer.status_code == 410
    assert "retired" in answer.json()["error"]["message"]


async def test_each_launch_gets_a_token_that_dies_with_its_worker(
    api: httpx.AsyncClient, store: Store, clock: FakeClock
) -> None:
    """The launch's token opens its namespace for its daemon; an expired launch's token,
    and a retired worker's, open nothing."""
    await provider(api)
    await queue(api, "tok", elastic(max=2), providerRef="fk")
    await submit_many(api, "tok", 2)
    seen: list[str] = []
    original = FakeProvider.launch

    async def capture(self: FakeProvider, request: LaunchRequest) -> dict[str, Any]:
        assert request.token is not None
        seen.append(request.token)
        return await original(self, request)

    FakeProvider.launch = capture  # type: ignore[method-assign]
    try:
        booted = (await tick(api))["tok"]["launch_id"]
        await tick(api)
    finally:
        FakeProvider.launch = original  # type: ignore[method-assign]
    first, second = ({"Authorization": f"Bearer {t}"} for t in seen)
    hello_body = {"queues": ["tok"], "launch_id": booted}
    joined = await api.post(f"{W}/hello", json=hello_body, headers=first)
    assert joined.status_code == 200, joined.text
    clock.advance(16)  # the second launch never said hello: its TTL passes
    await api.patch(f"{NS}/queues/tok", json={"elasticity": elastic(max=0)})
    decision = (await tick(api))["tok"]
    assert decision["action"] == "scale_down"
    for headers in (first, second):
        assert (await api.get(f"{NS}/queues", headers=headers)).status_code == 401


async def test_an_expired_launch_is_stopped_at_its_provider(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    """A launch whose daemon never said hello would otherwise keep an instance running."""
    await provider(api)
    await queue(api, "lost", elastic(max=1), providerRef="fk")
    await submit_many(api, "lost", 1)
    launch_id = (await tick(api))["lost"]["launch_id"]
    clock.advance(16)
    await tick(api)
    launches = (await api.get(f"{NS}/providers/fk/launches")).json()["launches"]
    lost = next(launch for launch in launches if launch["id"] == launch_id)
    assert lost["state"] == "expired"
    assert lost["terminated_at"] is not None and lost["terminate_error"] is None


async def test_a_launched_daemon_that_vanishes_is_dropped_and_its_work_runs_again(
    api: httpx.AsyncClient, store: Store, clock: FakeClock
) -> None:
    """An instance or pod that disappears stops heartbeating: after the worker TTL its row
    goes, its lease returns the invocation to the queue, and the controller launches anew."""
    await provider(api)
    await queue(api, "vanish", elastic(max=1), providerRef="fk")
    await submit_many(api, "vanish", 1)
    launch_id = (await tick(api))["vanish"]["launch_id"]
    gone = await hello(api, ["vanish"], launch_id=launch_id)
    [held] = await claim(api, gone)
    clock.advance(reaper.WORKER_TTL_S + 1)  # no heartbeat: the machine is gone
    swept = await reaper.reap(store, clock())
    assert (swept["retried"], swept["workers_dropped"]) == (1, 1)
    decision = (await tick(api))["vanish"]
    assert decision["before"]["daemon_count"] == 0
    assert decision["action"] == "scale_up"
    clock.advance(60)  # past the retry backoff
    other = await hello(api, ["vanish"])
    [again] = await claim(api, other)
    assert (again["id"], again["attempts"]) == (held["id"], 2)


async def test_counters_of_many_queues_reset_together(api: httpx.AsyncClient, store: Store) -> None:
    """Queues leaving their counters at zero in one tick are cleared in one go."""
    workers = {}
    for name in ("warm-a", "warm-b", "warm-c"):
        await queue(api, name, {"kind": "pool_with_threshold", "max": 3})
        workers[name] = await hello(api, [name], capacity=1)
        await submit_many(api, name, 1)
        assert len(await claim(api, workers[name])) == 1  # utilization 1.0: counts above
    await tick(api)
    async with store.read() as conn:
        counted = (await conn.execute(select(func.count()).select_from(controller_state))).scalar()
    assert counted == 3
    for name in workers:  # a second, idle worker: utilization 0.5 (the dead band)
        await hello(api, [name], capacity=1)
    decisions = await tick(api)
    assert all("dead band" in decisions[name]["reason"] for name in workers)
    async with store.read() as conn:
        left = (await conn.execute(select(func.count()).select_from(controller_state))).scalar()
    assert left == 0


async def test_the_server_with_that_node_id_ticks_a_pinned_queue(
    api: httpx.AsyncClient, store: Store, clock: FakeClock
) -> None:
    """``serverNodeId`` pins a queue to the server started with that node id."""
    from lakeshore.services.fleet.controller import Controller

    await queue(api, "pinned", elastic(), serverNodeId="node-b")
    await queue(api, "free", elastic())
    node_b = Controller(store, clock=clock, server_url="http://b", node_id="node-b")
    scopes = {d["scope"] for d in await node_b.tick()}
    assert scopes == {"pinned", "free"}
    unnamed = Controller(store, clock=clock, server_url="http://a")
    assert {d["scope"] for d in await unnamed.tick()} == {"free"}


async def test_a_snapshot_read_in_parts_sees_every_queue_and_worker(
    api: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The snapshot's large reads come in parts (so the API is served between them);
    parts of two rows read across their boundaries lose nothing."""
    monkeypatch.setattr(ctl_store, "PART_ROWS", 2)
    for n in range(5):
        await queue(api, f"parts-{n}", elastic(max=0))
        for _ in range(n):
            await hello(api, [f"parts-{n}"])
    decisions = await tick(api)
    daemons = {s: d["before"]["daemon_count"] for s, d in decisions.items() if "parts" in s}
    assert daemons == {f"parts-{n}": n for n in range(5)}
