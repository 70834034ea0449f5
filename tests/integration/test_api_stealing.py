"""Work-stealing in the claim path: pool siblings, the match gate, the steal delay.

An idle worker whose own queues give it nothing may claim from queues sharing an
``elasticity.pool`` with one of its own, when the sibling's ``match`` admits it and it
has been idle ``steal_delay_s`` (the largest over its own queues). "Idle" means holding
no running invocation; idle since = its last finished invocation, else its hello.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tests.conftest import FakeClock
from tests.integration.test_api_workers import claim, hello, submit

NS = "/v1/namespaces/default"
W = "/v1/workers"


async def queue(api: httpx.AsyncClient, name: str, ns: str = NS, **elasticity: Any) -> None:
    """Create a queue; ``elasticity`` keys (pool, match, steal_delay_s) go in a fixed spec."""
    body: dict[str, Any] = {"name": name}
    if elasticity:
        body["elasticity"] = {"kind": "fixed", **elasticity}
    response = await api.post(f"{ns}/queues", json=body)
    assert response.status_code == 201, response.text


async def complete(api: httpx.AsyncClient, worker: str, invocation: dict[str, Any]) -> None:
    url = f"{W}/{worker}/invocations/{invocation['id']}/complete"
    response = await api.post(url, json={"result": None})
    assert response.status_code == 200, response.text


async def test_an_idle_worker_steals_from_a_pool_sibling(api: httpx.AsyncClient) -> None:
    await queue(api, "a", pool="p")
    await queue(api, "b", pool="p")
    wanted = await submit(api, "b")
    worker = await hello(api, ["a"])
    [got] = await claim(api, worker)
    assert (got["id"], got["queue"], got["worker"]) == (wanted["id"], "b", worker)
    assert (got["state"], got["attempts"]) == ("running", 1)
    assert got["lease_expires_at"] is not None
    beat = await api.post(f"{W}/{worker}/heartbeat")  # leased like its own work
    assert beat.json()["held"] == [got["id"]]
    await complete(api, worker, got)
    stored = (await api.get(f"{NS}/invocations/{got['id']}")).json()
    assert stored["state"] == "succeeded"


async def test_a_steal_fills_free_capacity_in_the_siblings_discipline(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    await queue(api, "a", pool="p")
    response = await api.post(
        f"{NS}/queues",
        json={"name": "b", "kind": "priority", "elasticity": {"kind": "fixed", "pool": "p"}},
    )
    assert response.status_code == 201, response.text
    for i, priority in enumerate([1, 9, 5, 7]):
        await submit(api, "b", args=[i], kwargs={"priority": priority})
        clock.advance(1)
    worker = await hello(api, ["a"], capacity=3)
    assert [i["args"][0] for i in await claim(api, worker)] == [1, 3, 2]


async def test_never_from_another_pool_or_a_queue_without_one(api: httpx.AsyncClient) -> None:
    await queue(api, "a", pool="p")
    await queue(api, "other", pool="q")
    await queue(api, "loner")
    await submit(api, "other")
    await submit(api, "loner")
    worker = await hello(api, ["a"])
    assert await claim(api, worker) == []
    unpooled = await hello(api, ["solo"])  # a worker with no pool steals from nothing
    assert await claim(api, unpooled) == []


async def test_own_work_comes_first(api: httpx.AsyncClient) -> None:
    await queue(api, "a", pool="p")
    await queue(api, "b", pool="p")
    for _ in range(3):
        await submit(api, "b")
    mine = await submit(api, "a")
    worker = await hello(api, ["a"], capacity=4)
    # own work found: no stealing on this claim, even with capacity to spare
    assert [i["id"] for i in await claim(api, worker)] == [mine["id"]]


async def test_a_busy_worker_does_not_steal_until_it_is_idle(api: httpx.AsyncClient) -> None:
    """Free capacity is not idleness: a worker holding any running invocation (its own or
    stolen) takes no more stolen work until it has finished everything it holds."""
    await queue(api, "a", pool="p")
    await queue(api, "b", pool="p")
    mine = await submit(api, "a")
    worker = await hello(api, ["a"], capacity=4)
    [got] = await claim(api, worker)
    assert got["id"] == mine["id"]
    await submit(api, "b")
    await submit(api, "b")
    assert await claim(api, worker) == []  # 3 slots free, but busy
    await complete(api, worker, got)
    stolen = await claim(api, worker)
    assert [i["queue"] for i in stolen] == ["b", "b"]


@pytest.mark.parametrize(
    ("tags", "runners", "steals"),
    [
        ([], ["docker"], False),  # missing the tag
        (["gpu:h100"], ["process"], False),  # missing the runner
        (["gpu:a100"], ["docker"], False),  # another tag is not the one
        (["gpu:h100"], ["docker"], True),
        (["gpu:h100", "zone:eu"], ["process", "docker"], True),  # extras are fine
    ],
)
async def test_a_siblings_match_gates_who_may_steal(
    api: httpx.AsyncClient, tags: list[str], runners: list[str], steals: bool
) -> None:
    await queue(api, "a", pool="p")
    await queue(api, "b", pool="p", match={"tags": ["gpu:h100"], "runners": ["docker"]})
    wanted = await submit(api, "b")
    worker = await hello(api, ["a"], tags=tags, runners=runners)
    claimed = [i["id"] for i in await claim(api, worker)]
    assert claimed == ([wanted["id"]] if steals else [])


async def test_a_match_on_the_worker_own_queue_does_not_gate_its_own_work(
    api: httpx.AsyncClient,
) -> None:
    await queue(api, "a", pool="p", match={"tags": ["gpu:h100"]})
    await queue(api, "b", pool="p")
    await submit(api, "a")
    await submit(api, "b")
    worker = await hello(api, ["a"], capacity=1)
    assert [i["queue"] for i in await claim(api, worker)] == ["a"]


async def test_the_steal_delay_is_the_largest_over_own_queues(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    await queue(api, "a", pool="p", steal_delay_s=2)
    await queue(api, "slow", steal_delay_s=10)  # no pool, but its delay still counts
    await queue(api, "b", pool="p", steal_delay_s=0)  # a sibling's own delay is not ours
    wanted = await submit(api, "b")
    worker = await hello(api, ["a", "slow"])  # idle since its hello
    paused = await api.post(f"{NS}/queues/slow/pause")  # paused, it is still the worker's
    assert paused.status_code == 200, paused.text
    assert await claim(api, worker) == []
    clock.advance(9.9)
    assert await claim(api, worker) == []
    clock.advance(0.1)
    assert [i["id"] for i in await claim(api, worker)] == [wanted["id"]]


async def test_the_steal_delay_counts_from_the_last_finished_invocation(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    await queue(api, "a", pool="p", steal_delay_s=5)
    await queue(api, "b", pool="p")
    await submit(api, "a")
    worker = await hello(api, ["a"])
    clock.advance(60)  # idle long since its hello, but then it works
    [own] = await claim(api, worker)
    clock.advance(30)
    await complete(api, worker, own)  # idle from here
    wanted = await submit(api, "b")
    clock.advance(4)
    assert await claim(api, worker) == []
    clock.advance(1)
    assert [i["id"] for i in await claim(api, worker)] == [wanted["id"]]


@pytest.mark.parametrize(("action", "steals"), [("pause", False), ("drain", True)])
async def test_a_sibling_dispatches_when_active_or_draining_only(
    api: httpx.AsyncClient, action: str, steals: bool
) -> None:
    await queue(api, "a", pool="p")
    await queue(api, "b", pool="p")
    wanted = await submit(api, "b")
    assert (await api.post(f"{NS}/queues/b/{action}")).status_code == 200
    worker = await hello(api, ["a"])
    claimed = [i["id"] for i in await claim(api, worker)]
    assert claimed == ([wanted["id"]] if steals else [])


async def test_a_paused_own_queue_lends_its_pool_nothing(api: httpx.AsyncClient) -> None:
    await queue(api, "a", pool="p")
    await queue(api, "b", pool="p")
    await submit(api, "b")
    await api.post(f"{NS}/queues/a/pause")
    worker = await hello(api, ["a"])
    assert await claim(api, worker) == []


async def test_a_pool_name_in_another_namespace_is_another_pool(api: httpx.AsyncClient) -> None:
    assert (await api.post("/v1/namespaces", json={"name": "team-b"})).status_code == 201
    await queue(api, "b", ns="/v1/namespaces/team-b", pool="p")
    response = await api.post("/v1/namespaces/team-b/queues/b/invocations", json={"fn": "m:f"})
    assert response.status_code == 201, response.text
    await queue(api, "a", pool="p")
    worker = await hello(api, ["a"])
    assert await claim(api, worker) == []


async def test_a_siblings_deadline_cutoff_applies_to_stolen_work(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    await queue(api, "a", pool="p")
    response = await api.post(
        f"{NS}/queues",
        json={
            "name": "b",
            "admission": {"deadline_cutoff_s": 10},
            "elasticity": {"kind": "fixed", "pool": "p"},
        },
    )
    assert response.status_code == 201, response.text
    overdue = await submit(api, "b")
    clock.advance(20)
    fresh = await submit(api, "b")
    worker = await hello(api, ["a"], capacity=2)
    assert [i["id"] for i in await claim(api, worker)] == [fresh["id"]]
    stored = (await api.get(f"{NS}/invocations/{overdue['id']}")).json()
    assert stored["state"] == "expired"


async def test_a_waiting_claim_wakes_for_a_submit_to_a_sibling(api: httpx.AsyncClient) -> None:
    await queue(api, "a", pool="p")
    await queue(api, "b", pool="p")
    worker = await hello(api, ["a"])
    waiting = asyncio.create_task(api.post(f"{W}/{worker}/claim", json={"timeout_s": 5}))
    await asyncio.sleep(0.05)  # let the claim start waiting (a real concurrent client)
    assert not waiting.done()
    wanted = await submit(api, "b")
    # well inside the 5 s re-check: only the wake-up can answer this fast
    response = await asyncio.wait_for(waiting, timeout=3)
    assert [i["id"] for i in response.json()["invocations"]] == [wanted["id"]]


async def test_a_waiting_claim_steals_when_its_delay_ends(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    """A claim kept waiting only by the steal delay re-checks when the delay ends rather
    than at the next 5 s re-check."""
    await queue(api, "a", pool="p", steal_delay_s=0.2)
    await queue(api, "b", pool="p")
    wanted = await submit(api, "b")
    worker = await hello(api, ["a"])
    waiting = asyncio.create_task(api.post(f"{W}/{worker}/claim", json={"timeout_s": 5}))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # not idle long enough yet
    clock.advance(0.2)  # the fake clock the server reads; its re-check comes at 0.2 s
    response = await asyncio.wait_for(waiting, timeout=3)
    assert [i["id"] for i in response.json()["invocations"]] == [wanted["id"]]
