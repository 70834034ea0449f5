"""The scale feed and explain, after ticks run by hand (both stores)."""

from __future__ import annotations

from typing import Any

import httpx

from tests.conftest import FakeClock
from tests.integration.test_api_workers import claim, hello
from tests.integration.test_controller import NS, elastic, provider, queue, submit_many, tick


async def test_the_feed_hides_noops_unless_verbose_and_pages_newest_first(
    api: httpx.AsyncClient,
) -> None:
    await provider(api)
    await queue(api, "fed", elastic(max=2), providerRef="fk")
    await submit_many(api, "fed", 5)
    for _ in range(4):  # launch, launch, noop, noop
        await tick(api)
        await submit_many(api, "fed", 1)  # a new pending count: no two no-ops alike
    quiet = (await api.get(f"{NS}/queues/fed/events")).json()
    assert [e["action"] for e in quiet["events"]] == ["scale_up", "scale_up"]
    assert quiet["events"][0]["reason"] == "target 2 > daemons 0 + in flight 1 → launch"
    assert all(e["repeats"] == 1 for e in quiet["events"])
    assert quiet["events"][0]["id"] > quiet["events"][1]["id"]
    assert quiet["events"][0]["rule"] == "fully_elastic.scale_up"
    assert "launch_id" in quiet["events"][0]["detail"]
    everything = (await api.get(f"{NS}/queues/fed/events", params={"verbose": "true"})).json()
    assert [e["action"] for e in everything["events"]] == [
        "tick_noop",
        "tick_noop",
        "scale_up",
        "scale_up",
    ]
    first = (await api.get(f"{NS}/queues/fed/events", params={"verbose": 1, "limit": 3})).json()
    assert len(first["events"]) == 3 and first["next_cursor"]
    rest = (
        await api.get(
            f"{NS}/queues/fed/events",
            params={"verbose": 1, "limit": 3, "cursor": first["next_cursor"]},
        )
    ).json()
    assert [e["id"] for e in rest["events"]] == [everything["events"][3]["id"]]
    newer = (
        await api.get(
            f"{NS}/queues/fed/events",
            params={"verbose": 1, "since": everything["events"][1]["id"]},
        )
    ).json()
    assert [e["id"] for e in newer["events"]] == [everything["events"][0]["id"]]


async def test_a_pooled_queue_shows_its_pool_events(api: httpx.AsyncClient) -> None:
    await queue(api, "m1", elastic(pool="shared"))
    await queue(api, "m2", elastic(pool="shared"))
    await hello(api, ["m1"])
    await tick(api)  # idle worker, nothing pending: the pool kills one
    pool = (await api.get(f"{NS}/pools/shared/events")).json()["events"]
    member = (await api.get(f"{NS}/queues/m2/events")).json()["events"]
    assert [e["scope"] for e in pool] == ["pool:shared"]
    assert member == pool
    missing = await api.get(f"{NS}/pools/nowhere/events")
    assert missing.status_code == 404
    assert (await api.get(f"{NS}/queues/m1/events", params={"cursor": "x"})).status_code == 422


async def test_explain_answers_why_it_did_not_scale(api: httpx.AsyncClient) -> None:
    await provider(api)
    await queue(api, "why", elastic(max=1), providerRef="fk")
    before = (await api.get(f"{NS}/queues/why/explain")).json()
    assert before["latest"] is None and "no tick" in before["why"]
    await submit_many(api, "why", 4)
    worker = await hello(api, ["why"], capacity=1)
    assert len(await claim(api, worker)) == 1
    await tick(api)
    answer = (await api.get(f"{NS}/queues/why/explain")).json()
    assert answer["latest"]["action"] == "tick_noop"
    assert answer["latest"]["reason"].startswith("at max (1)")
    assert answer["latest"]["rule"] == "fully_elastic.at_max"
    assert answer["why"] == "raise max above 1"
    assert answer["policy"]["max"] == 1 and answer["provider"] == "fk"
    assert (answer["now"]["pending"], answer["now"]["daemonCount"]) == (3, 1)
    await api.post(f"{NS}/queues/why/pause")
    paused = (await api.get(f"{NS}/queues/why/explain")).json()
    assert paused["why"].startswith("the queue is paused")


async def test_stats_show_the_counters_and_scope(api: httpx.AsyncClient) -> None:
    await queue(api, "warm", {"kind": "pool_with_threshold", "pool": "w"})
    worker = await hello(api, ["warm"], capacity=1)
    await submit_many(api, "warm", 1)
    assert len(await claim(api, worker)) == 1
    await tick(api)
    stats = (await api.get(f"{NS}/queues/warm/stats")).json()
    assert stats["scope"] == "pool:w"
    assert stats["counters"] == {"consecutiveAbove": 1, "consecutiveBelow": 0}


async def test_explain_for_a_pooled_queue_gives_the_pools_policy_provider_and_feed(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    """The pool ticks with its first member's policy and the first provider a member
    names, not the asked-about queue's own; explain says so and names the disagreement."""
    await provider(api)
    await queue(api, "zeta", elastic(max=2, pool="gpu"))  # first member, no provider
    clock.advance(1)
    await queue(api, "alpha", elastic(max=5, pool="gpu"), providerRef="fk")
    await submit_many(api, "alpha", 3)
    decision = (await tick(api))["pool:gpu"]
    assert decision["action"] == "scale_up"
    answer = (await api.get(f"{NS}/queues/alpha/explain")).json()
    assert answer["scope"] == "pool:gpu"
    assert answer["policy"]["max"] == 2 and answer["policy"]["kind"] == "fully_elastic"
    assert answer["provider"] == "fk"
    assert answer["pool"] == {
        "name": "gpu",
        "feed": "pool:gpu",
        "members": ["zeta", "alpha"],
        "policyFrom": "zeta",
        "providerFrom": "alpha",
        "disagreements": [
            'queue "alpha" declares kind=fully_elastic min=0 max=5; '
            'the pool follows "zeta" (kind=fully_elastic min=0 max=2)'
        ],
    }
    assert answer["latest"]["scope"] == "pool:gpu"
    assert answer["latest"]["action"] == "scale_up"
    assert answer["latest"]["reason"] == decision["reason"]
    first = (await api.get(f"{NS}/queues/zeta/explain")).json()
    assert (first["provider"], first["pool"]["providerFrom"]) == ("fk", "alpha")
    assert first["latest"] == answer["latest"]

    await api.post(f"{NS}/queues/zeta/pause")  # a paused queue leaves the ticking pool
    alone = (await api.get(f"{NS}/queues/alpha/explain")).json()
    assert alone["policy"]["max"] == 5
    assert alone["pool"]["members"] == ["alpha"] and alone["pool"]["disagreements"] == []
    paused = (await api.get(f"{NS}/queues/zeta/explain")).json()
    assert paused["why"] == (
        'the queue is paused: the controller ticks active queues only (pool "gpu" ticks without it)'
    )


async def test_explain_for_a_standalone_queue_has_no_pool(api: httpx.AsyncClient) -> None:
    await queue(api, "solo", elastic(max=3))
    answer = (await api.get(f"{NS}/queues/solo/explain")).json()
    assert answer["pool"] is None and answer["scope"] == "solo"
    assert (answer["policy"]["max"], answer["provider"]) == (3, None)


SIGNALS = ("daemon_count", "utilization", "pending", "in_flight")


def _signals_of(stats: dict[str, Any]) -> dict[str, Any]:
    """``stats``' signals under the names a decision's ``before`` gives them."""
    names = ("daemonCount", "utilization", "pending", "inFlight")
    return {signal: stats[name] for signal, name in zip(SIGNALS, names, strict=True)}


async def test_stats_explain_and_the_tick_read_the_same_signals_of_a_pool(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    """For a pooled queue, stats and explain give the pool's signals — the ones the tick
    decides on — and the member's own counts beside them; an expired launch counts in
    none of them."""
    await provider(api)
    elasticity = {"kind": "fully_elastic", "pool": "gpu", "max": 4}
    await queue(api, "a", elasticity, providerRef="fk")
    await queue(api, "b", elasticity, providerRef="fk")
    on_a = await hello(api, ["a"], capacity=2)
    await hello(api, ["b"], capacity=2)
    await submit_many(api, "a", 3)
    await submit_many(api, "b", 2)
    assert len(await claim(api, on_a)) == 2  # a: 1 pending, 2 running; b: 2 pending
    stats = (await api.get(f"{NS}/queues/a/stats")).json()
    assert _signals_of(stats) == {
        "daemon_count": 2,
        "utilization": 0.5,
        "pending": 3,
        "in_flight": 0,
    }
    assert stats["member"] == {
        "pending": 1, "running": 2, "daemonCount": 1, "capacity": 2, "utilization": 1.0
    }  # fmt: skip
    assert stats["pool"] == {"members": ["a", "b"]}
    assert stats["byState"]["pending"] == 1  # the queue's own
    explained = (await api.get(f"{NS}/queues/a/explain")).json()
    assert explained["now"] == stats
    decision = (await tick(api))["pool:gpu"]
    assert decision["before"] == _signals_of(stats)  # what stats said is what it read
    assert decision["action"] == "scale_up"
    # what explain said the next tick would do is what it did: the same plan
    said = ("action", "reason", "rule", "hint")
    assert {k: decision[k] for k in said} == {k: explained["next"][k] for k in said}
    assert explained["next"]["estimates"] is None  # a wait_target decision's only
    booting = (await api.get(f"{NS}/queues/b/stats")).json()
    assert booting["inFlight"] == 1 and booting["pending"] == 3
    assert booting["member"]["pending"] == 2
    clock.advance(16)  # the fake provider's launch expires without a hello
    expired = (await api.get(f"{NS}/queues/a/stats")).json()
    assert expired["inFlight"] == 0
    assert (await tick(api))["pool:gpu"]["before"] == _signals_of(expired)


async def test_stats_of_a_lone_queue_have_no_member_block(api: httpx.AsyncClient) -> None:
    await queue(api, "solo", elastic())
    stats = (await api.get(f"{NS}/queues/solo/stats")).json()
    assert (stats["scope"], stats["member"], stats["pool"]) == ("solo", None, None)
    assert (await tick(api))["solo"]["before"] == _signals_of(stats)


async def test_identical_noops_of_a_queue_fold_into_one_row(api: httpx.AsyncClient) -> None:
    """A steady queue's no-ops are one row with a repeat count and the last tick's time;
    a different decision starts a new row, and a return to the old no-op a third."""
    await provider(api)
    await queue(api, "calm", elastic(max=2), providerRef="fk")
    for _ in range(5):
        await tick(api)
    rows = (await api.get(f"{NS}/queues/calm/events", params={"verbose": 1})).json()["events"]
    assert [(e["action"], e["repeats"]) for e in rows] == [("tick_noop", 5)]
    assert rows[0]["lastAt"] >= rows[0]["createdAt"]
    await submit_many(api, "calm", 1)
    assert (await tick(api))["calm"]["action"] == "scale_up"
    await tick(api)  # waiting on the launch: a no-op of another reason
    await tick(api)
    rows = (await api.get(f"{NS}/queues/calm/events", params={"verbose": 1})).json()["events"]
    assert [(e["action"], e["repeats"]) for e in rows] == [
        ("tick_noop", 2),
        ("scale_up", 1),
        ("tick_noop", 5),
    ]
