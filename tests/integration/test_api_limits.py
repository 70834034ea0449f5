"""Running limits and fair turns (issue 39, points 2 and 3), through the API on both
stores, and under racing claimers on PostgreSQL.

``admission.max_running``: at most N of a queue's invocations run (leased) at once;
``admission.max_running_per_key``: at most N of one ``concurrency_key`` (rows without a
key are not limited by it). A claim takes turns between keys: the first of each key,
then the second …, so one key's flood does not starve another's trickle.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from lakeshore.domain.queue import parse_spec
from lakeshore.store import claimable
from lakeshore.store import invocations as inv_store
from lakeshore.store import namespaces as ns_store
from lakeshore.store import queues as queue_store
from lakeshore.store.engine import Store
from tests.conftest import FakeClock
from tests.integration.test_api_workers import claim, hello, submit

NS = "/v1/namespaces/default"


async def queue(
    api: httpx.AsyncClient, name: str = "q", kind: str = "fifo", **admission: Any
) -> None:
    body = {"name": name, "kind": kind, "admission": admission}
    response = await api.post(f"{NS}/queues", json=body)
    assert response.status_code == 201, response.text


async def put(api: httpx.AsyncClient, clock: FakeClock, **body: Any) -> dict[str, Any]:
    """A submit to ``q`` a millisecond after the one before (the test's clock stands)."""
    clock.advance(0.001)
    return await submit(api, "q", **body)


async def complete(api: httpx.AsyncClient, worker: str, invocation: dict[str, Any]) -> None:
    done = f"/v1/workers/{worker}/invocations/{invocation['id']}/complete"
    assert (await api.post(done, json={"result": None})).status_code == 200


async def test_max_running_leases_at_most_the_limit_and_a_finish_frees_a_slot(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    await queue(api, max_running=2)
    submitted = [(await put(api, clock))["id"] for _ in range(5)]
    one, two = await hello(api, ["q"], capacity=10), await hello(api, ["q"], capacity=10)

    first = await claim(api, one, max=10)
    assert [i["id"] for i in first] == submitted[:2]
    response = await api.post(f"/v1/workers/{two}/claim", json={"timeout_s": 0})
    answer = response.json()
    assert answer["invocations"] == []
    # pending work the limit holds back: a short look again, never negative or absurd
    assert answer["next_in_s"] is not None and 0 <= answer["next_in_s"] <= 1

    await complete(api, one, first[0])
    assert [i["id"] for i in await claim(api, two, max=10)] == [submitted[2]]
    assert await claim(api, one, max=10) == []
    stats = (await api.get(f"{NS}/queues/q/stats")).json()
    assert (stats["running"], stats["pending"]) == (2, 2)


async def test_max_running_per_key_limits_each_key_and_not_rows_without_one(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    await queue(api, max_running_per_key=1)
    a1 = await put(api, clock, concurrency_key="a")
    a2 = await put(api, clock, concurrency_key="a")
    b1 = await put(api, clock, concurrency_key="b")
    free1 = await put(api, clock)
    free2 = await put(api, clock)
    worker = await hello(api, ["q"], capacity=10)

    taken = {i["id"] for i in await claim(api, worker, max=10)}
    assert taken == {a1["id"], b1["id"], free1["id"], free2["id"]}
    assert await claim(api, worker, max=10) == []
    await complete(api, worker, a1)
    assert [i["id"] for i in await claim(api, worker, max=10)] == [a2["id"]]


async def test_both_limits_together(api: httpx.AsyncClient, clock: FakeClock) -> None:
    await queue(api, max_running=3, max_running_per_key=2)
    for key in "aaaab":
        await put(api, clock, concurrency_key=key)
    worker = await hello(api, ["q"], capacity=10)
    taken = [i["concurrency_key"] for i in await claim(api, worker, max=10)]
    assert sorted(taken) == ["a", "a", "b"]


@pytest.mark.parametrize("kind", ["fifo", "filo", "priority", "boltzmann"])
async def test_a_claim_takes_turns_between_keys(
    api: httpx.AsyncClient, clock: FakeClock, kind: str
) -> None:
    await queue(api, kind=kind)
    flood = [(await put(api, clock, concurrency_key="a"))["id"] for _ in range(3)]
    # a row without a key takes its turns from among the queue's first rows
    plain = (await put(api, clock))["id"]
    flood += [(await put(api, clock, concurrency_key="a"))["id"] for _ in range(3)]
    trickle = [(await put(api, clock, concurrency_key="b"))["id"] for _ in range(2)]
    worker = await hello(api, ["q"], capacity=10)

    taken = [i["id"] for i in await claim(api, worker, max=5)]
    if kind == "filo":  # newest first, in turns: b, a, then b, a (no key: not in the first 5)
        assert taken == [trickle[-1], flood[-1], trickle[-2], flood[-2], flood[-3]]
    else:  # oldest first (one priority), in turns: a, no key, b, then a, b
        assert taken == [flood[0], plain, trickle[0], flood[1], trickle[1]]


async def test_turns_stay_within_one_priority(api: httpx.AsyncClient, clock: FakeClock) -> None:
    await queue(api, kind="priority")
    low = [
        (await put(api, clock, concurrency_key="a", kwargs={"priority": 1}))["id"] for _ in range(2)
    ]
    high_a = [
        (await put(api, clock, concurrency_key="a", kwargs={"priority": 5}))["id"] for _ in range(3)
    ]
    high_b = (await put(api, clock, concurrency_key="b", kwargs={"priority": 5}))["id"]
    worker = await hello(api, ["q"], capacity=10)
    taken = [i["id"] for i in await claim(api, worker, max=6)]
    assert taken == [high_a[0], high_b, high_a[1], high_a[2], low[0], low[1]]


async def test_a_queue_without_keys_keeps_its_order(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    await queue(api)
    ids = [(await put(api, clock))["id"] for _ in range(4)]
    worker = await hello(api, ["q"], capacity=10)
    assert [i["id"] for i in await claim(api, worker, max=10)] == ids


async def test_a_waiting_claim_is_not_handed_past_the_limit(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    """A submit to a queue at its limit is not handed to a waiting claim: it stays
    pending until a slot frees."""
    await queue(api, max_running=1)
    worker = await hello(api, ["q"], capacity=4)
    await put(api, clock)
    held = await claim(api, worker, max=4)
    assert len(held) == 1
    waiting = asyncio.create_task(
        api.post(f"/v1/workers/{worker}/claim", json={"timeout_s": 0.3, "max": 4})
    )
    await asyncio.sleep(0.05)  # let the claim begin to wait
    await put(api, clock)
    assert (await waiting).json()["invocations"] == []
    stats = (await api.get(f"{NS}/queues/q/stats")).json()
    assert (stats["running"], stats["pending"]) == (1, 1)


async def test_a_waiting_claim_is_handed_within_the_limit(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    await queue(api, max_running=2, max_running_per_key=1)
    worker = await hello(api, ["q"], capacity=4)
    waiting = asyncio.create_task(
        api.post(f"/v1/workers/{worker}/claim", json={"timeout_s": 5, "max": 4})
    )
    await asyncio.sleep(0.05)
    handed = await put(api, clock, concurrency_key="a")
    got = (await waiting).json()["invocations"]
    assert [i["id"] for i in got] == [handed["id"]]


# racing claimers: PostgreSQL, several connections claiming at once

NOW = datetime(2026, 1, 1, tzinfo=UTC)


async def _queue_with(store: Store, admission: dict[str, Any], keys: list[str | None]) -> str:
    async with store.write() as conn:
        await ns_store.insert_namespace(conn, id="ns_race", name="race", now=NOW)
        spec = parse_spec({"name": "race", "admission": admission})
        await queue_store.insert_queue(
            conn, id="q_race", namespace_id="ns_race", spec=spec, now=NOW
        )
        for n, key in enumerate(keys):
            await conn.execute(
                text(
                    "INSERT INTO invocations (id, namespace_id, queue_id, queue_name, fn, args,"
                    " kwargs, priority, state, attempts, max_attempts, available_at, created_at,"
                    " concurrency_key) VALUES (:id, 'ns_race', 'q_race', 'race', 'm:f', '[]',"
                    " '{}', 0, 'pending', 0, 1, :at, :at, :key)"
                ),
                {"id": f"i_{n:04d}", "at": NOW, "key": key},
            )
    return "q_race"


async def _race(store: Store, queue_id: str, admission: dict[str, Any], claimers: int) -> None:
    limits = claimable.Limits.of(admission)
    ready = asyncio.Barrier(claimers)

    async def one(n: int) -> None:
        async with store.write() as conn:
            # every claimer's transaction open before any claims: they overlap
            await conn.execute(text("SELECT 1"))
            await ready.wait()
            await inv_store.claim(
                conn,
                queue_id=queue_id,
                kind="fifo",
                worker_id=f"w_{n}",
                limit=10,
                now=NOW,
                lease_s=60,
                limits=limits,
                keyed=True,
            )

    await asyncio.gather(*(one(n) for n in range(claimers)))


async def _running(store: Store) -> list[tuple[str | None, int]]:
    async with store.read() as conn:
        found = await conn.execute(
            text(
                "SELECT concurrency_key, count(*) FROM invocations WHERE state = 'running'"
                " GROUP BY concurrency_key ORDER BY concurrency_key"
            )
        )
        return [(key, int(count)) for key, count in found.all()]


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_racing_claims_never_lease_past_max_running(store: Store) -> None:
    admission = {"max_running": 3}
    queue_id = await _queue_with(store, admission, [None] * 60)
    for _ in range(3):  # three rounds of eight claimers at once, each asking for 10
        await _race(store, queue_id, admission, claimers=8)
        assert sum(count for _, count in await _running(store)) == 3


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_racing_claims_never_lease_past_max_running_per_key(store: Store) -> None:
    admission = {"max_running": 7, "max_running_per_key": 2}
    keys: list[str | None] = [None, "a", "b"] * 30 + ["c"] * 2
    queue_id = await _queue_with(store, admission, keys)
    await _race(store, queue_id, admission, claimers=8)
    running = dict(await _running(store))
    assert running["a"] <= 2 and running["b"] <= 2 and running["c"] <= 2
    assert sum(running.values()) == 7
