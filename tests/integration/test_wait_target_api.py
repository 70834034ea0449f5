"""``wait_target`` and ``max_step`` through the HTTP API, with the ``fake`` provider and
ticks on demand, on both stores: a burst in the first tick, steps of ``max_step``, the
boot and service times learned from the queue's own launches and invocations, and the
estimates in the event and in ``explain``."""

from __future__ import annotations

from typing import Any

import httpx

from tests.conftest import FakeClock
from tests.integration.test_api_workers import claim, hello
from tests.integration.test_controller import NS, W, elastic, provider, queue, submit_many, tick


async def _launches(api: httpx.AsyncClient) -> list[dict[str, Any]]:
    answer = await api.get(f"{NS}/providers/fk/launches", params={"limit": 100})
    return list(answer.json()["launches"])


def waiting(**extra: Any) -> dict[str, Any]:
    return {"kind": "wait_target", "wait_s": 60, "max": 32, **extra}


async def test_a_wait_target_queue_with_a_backlog_and_no_daemon_bursts_in_its_first_tick(
    api: httpx.AsyncClient,
) -> None:
    await provider(api, launch_ttl_s=600)
    await queue(api, "gpu", waiting(service_s=45), providerRef="fk")
    await submit_many(api, "gpu", 100)
    first = (await tick(api))["gpu"]
    assert first["action"] == "scale_up"
    count = first["count"]
    assert 1 < count <= 32
    assert first["reason"].startswith(f"launch {count}: backlog 100 ")
    assert len(first["launch_ids"]) == count
    assert (first["before"]["in_flight"], first["after"]["in_flight"]) == (0, count)
    assert len(await _launches(api)) == count
    estimates = first["estimates"]
    assert estimates["service_s"]["source"] == "hint"
    assert estimates["boot_s"]["source"] == "default"
    assert estimates["p95_wait_s_without"] is None  # no fleet: the backlog never starts
    assert estimates["p95_wait_s_with"] > 0
    # the event and explain carry what the decision was computed from
    events = (await api.get(f"{NS}/queues/gpu/events")).json()["events"]
    assert events[0]["detail"]["estimates"] == estimates
    assert events[0]["detail"]["count"] == count
    explained = (await api.get(f"{NS}/queues/gpu/explain")).json()
    assert explained["latest"]["reason"] == first["reason"]
    assert explained["latest"]["detail"]["estimates"]["service_s"]["value"] == 45.0
    assert explained["policy"]["kind"] == "wait_target"
    assert (explained["policy"]["wait_s"], explained["policy"]["max_step"]) == (60, None)
    assert explained["next"]["estimates"]["service_s"]["value"] == 45.0  # the next tick's
    second = (await tick(api))["gpu"]  # all booting: nothing more to launch
    assert second["action"] == "tick_noop"


async def test_fully_elastic_launches_max_step_at_once_and_one_without(
    api: httpx.AsyncClient,
) -> None:
    await provider(api, launch_ttl_s=600)
    await queue(api, "stepped", elastic(max=32, max_step=8), providerRef="fk")
    await queue(api, "plain", elastic(max=32), providerRef="fk")
    await submit_many(api, "stepped", 100)
    await submit_many(api, "plain", 100)
    decisions = await tick(api)
    stepped, plain = decisions["stepped"], decisions["plain"]
    assert stepped["reason"] == "target 32 > daemons 0 + in flight 0 → launch 8"
    assert len(stepped["launch_ids"]) == 8
    assert stepped["after"]["in_flight"] == 8
    assert plain["reason"] == "target 32 > daemons 0 + in flight 0 → launch"
    assert "launch_ids" not in plain and plain["after"]["in_flight"] == 1
    scopes = [launch["scope"] for launch in await _launches(api)]
    assert (scopes.count("stepped"), scopes.count("plain")) == (8, 1)
    again = (await tick(api))["stepped"]
    assert again["reason"] == "target 32 > daemons 0 + in flight 8 → launch 8"


async def test_boot_and_service_times_are_learned_from_the_queues_own_history(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    await provider(api, launch_ttl_s=600)
    await queue(api, "learn", waiting(max=3, boot_s=30), providerRef="fk")
    await submit_many(api, "learn", 6)
    first = (await tick(api))["learn"]
    assert first["estimates"]["boot_s"] == {"value": 30.0, "source": "hint", "samples": 0}
    launch_ids = first["launch_ids"]
    clock.advance(90)  # the launches say hello 90 s after they were asked for
    workers = [await hello(api, ["learn"], capacity=1, launch_id=i) for i in launch_ids]
    held = [(w, c["id"]) for w in workers for c in await claim(api, w, max=1)]
    clock.advance(40)  # each runs for 40 s
    for worker, invocation in held:
        done = await api.post(
            f"{W}/{worker}/invocations/{invocation}/complete", json={"result": None}
        )
        assert done.status_code == 200, done.text
    later = (await tick(api))["learn"]
    learned = later["estimates"]
    assert learned["boot_s"] == {"value": 90.0, "source": "learned", "samples": len(launch_ids)}
    assert learned["service_s"]["source"] == "learned"
    assert learned["service_s"]["value"] == 40.0
    assert learned["arrivals_per_s"]["source"] == "learned"
    explained = (await api.get(f"{NS}/queues/learn/explain")).json()
    assert explained["latest"]["detail"]["estimates"]["boot_s"]["source"] == "learned"
    assert "~90 s" in explained["next"]["reason"] or explained["next"]["action"] == "tick_noop"


async def test_idle_daemons_are_kept_through_a_gap_shorter_than_a_boot(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    await provider(api, launch_ttl_s=600)
    await queue(api, "gap", waiting(wait_s=300, max=2), providerRef="fk")
    await submit_many(api, "gap", 1)
    launch_id = (await tick(api))["gap"]["launch_id"]
    clock.advance(120)  # a boot takes 120 s
    worker = await hello(api, ["gap"], capacity=1, launch_id=launch_id)
    [job] = await claim(api, worker, max=1)
    done = await api.post(f"{W}/{worker}/invocations/{job['id']}/complete", json={"result": None})
    assert done.status_code == 200, done.text
    clock.advance(60)  # idle for less than a boot
    kept = (await tick(api))["gap"]
    assert kept["action"] == "tick_noop", kept["reason"]
    assert kept["estimates"]["boot_s"] == {"value": 120.0, "source": "learned", "samples": 1}
    clock.advance(600)  # now idle for far longer than a boot, and arrivals rarer than boots
    gone = (await tick(api))["gap"]
    assert gone["action"] == "scale_down", gone["reason"]
    assert gone["victim"] == worker
    assert gone["reason"].endswith("1 idle for longer than a boot (~2 min)")


async def test_delayed_work_and_schedule_slots_due_within_a_boot_count_as_demand_now(
    api: httpx.AsyncClient,
) -> None:
    await provider(api, launch_ttl_s=600)
    await queue(api, "later", waiting(max=8, boot_s=120), providerRef="fk")
    for delay in (30, 60, 90, 600):  # three fall due within a boot, one well after
        sent = await api.post(
            f"{NS}/queues/later/invocations", json={"fn": "tests.udfs:noop", "delay_s": delay}
        )
        assert sent.status_code == 201, sent.text
    every = {"name": "often", "fn": "tests.udfs:noop", "every_s": 50}
    made = await api.post(f"{NS}/queues/later/schedules", json=every)
    assert made.status_code == 201, made.text
    decision = (await tick(api))["later"]
    # nothing is pending yet; 3 delayed and 2 or 3 slots (every 50 s) fall due in 120 s
    assert decision["before"]["pending"] == 0
    assert decision["estimates"]["due_soon"] in (5, 6)
    assert decision["action"] == "scale_up", decision["reason"]


async def test_a_new_template_learns_its_boot_time_afresh(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    await provider(api, launch_ttl_s=600)
    await queue(api, "tpl", waiting(max=1, boot_s=30), providerRef="fk")
    await submit_many(api, "tpl", 3)
    launch_id = (await tick(api))["tpl"]["launch_id"]
    clock.advance(90)
    await hello(api, ["tpl"], capacity=1, launch_id=launch_id)
    learned = (await tick(api))["tpl"]["estimates"]["boot_s"]
    assert (learned["value"], learned["source"]) == (90.0, "learned")
    bigger = {"daemonTemplate": {"instance_type": "p5.48xlarge"}}
    assert (await api.patch(f"{NS}/queues/tpl", json=bigger)).status_code == 200
    afresh = (await tick(api))["tpl"]["estimates"]["boot_s"]
    assert (afresh["value"], afresh["source"]) == (30.0, "hint")  # its own boots: none yet


async def test_before_any_boot_is_learned_the_provider_s_boot_s_is_the_estimate(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    await provider(api, launch_ttl_s=600, boot_s=120)
    await queue(api, "configured", waiting(service_s=45), providerRef="fk")
    await queue(api, "hinted", waiting(service_s=45, boot_s=30), providerRef="fk")
    await submit_many(api, "configured", 100)
    await submit_many(api, "hinted", 100)
    decisions = await tick(api)
    first = decisions["configured"]
    assert first["action"] == "scale_up", first["reason"]
    assert first["estimates"]["boot_s"] == {"value": 120.0, "source": "provider", "samples": 0}
    assert "booting in ~2 min" in first["reason"]
    # the policy's own hint comes before its provider's
    hinted = decisions["hinted"]["estimates"]["boot_s"]
    assert hinted == {"value": 30.0, "source": "hint", "samples": 0}
    explained = (await api.get(f"{NS}/queues/configured/explain")).json()
    assert explained["next"]["estimates"]["boot_s"]["source"] == "provider"
    clock.advance(75)  # a launch says hello 75 s after it was asked for: learned from then on
    await hello(api, ["configured"], capacity=1, launch_id=first["launch_ids"][0])
    learned = (await tick(api))["configured"]["estimates"]["boot_s"]
    assert learned == {"value": 75.0, "source": "learned", "samples": 1}


async def test_a_provider_s_boot_s_is_validated_at_registration(api: httpx.AsyncClient) -> None:
    for bad in (0, -1, 86_401, "2m"):
        body = {"name": "bad", "kind": "fake", "config": {"boot_s": bad}}
        refused = await api.post(f"{NS}/providers", json=body)
        assert refused.status_code == 422, refused.text
        assert "config.boot_s" in refused.text
    shown = await api.post(
        f"{NS}/providers", json={"name": "ok", "kind": "fake", "config": {"boot_s": 86_400}}
    )
    assert shown.status_code == 201, shown.text
    assert shown.json()["config"]["boot_s"] == 86_400
