"""Admission: max_depth (reject and block), rate_limit, deadline_cutoff_s."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from lakeshore.services.taskqueue import reaper
from lakeshore.store.engine import Store
from tests.conftest import FakeClock

NS = "/v1/namespaces/default"


async def queue(api: httpx.AsyncClient, **admission: Any) -> None:
    response = await api.post(f"{NS}/queues", json={"name": "q", "admission": admission})
    assert response.status_code == 201, response.text


async def submit(api: httpx.AsyncClient, **params: Any) -> httpx.Response:
    return await api.post(f"{NS}/queues/q/invocations", json={"fn": "m:f"}, params=params)


async def pending(api: httpx.AsyncClient) -> int:
    return int((await api.get(f"{NS}/queues/q/stats")).json()["pending"])


async def test_a_full_queue_rejects_with_429(api: httpx.AsyncClient) -> None:
    await queue(api, max_depth=2)
    assert [(await submit(api)).status_code for _ in range(2)] == [201, 201]
    refused = await submit(api)
    assert refused.status_code == 429
    assert refused.json()["error"]["field"] == "admission.max_depth"
    assert "2 pending, max_depth 2" in refused.json()["error"]["message"]
    assert await pending(api) == 2


async def test_a_batch_that_would_overflow_stores_nothing(api: httpx.AsyncClient) -> None:
    await queue(api, max_depth=2)
    items = [{"fn": "m:f"}] * 3
    response = await api.post(f"{NS}/queues/q/invocations/batch", json={"invocations": items})
    assert response.status_code == 429
    assert await pending(api) == 0


async def test_block_waits_for_room_then_admits(api: httpx.AsyncClient) -> None:
    await queue(api, max_depth=1, on_full="block")
    assert (await submit(api)).status_code == 201
    waiting = asyncio.create_task(submit(api, wait_s=10))
    await asyncio.sleep(0.1)  # a real concurrent client, parked on the full queue
    assert not waiting.done()
    worker = (await api.post("/v1/workers/hello", json={"queues": ["q"]})).json()["id"]
    claimed = await api.post(f"/v1/workers/{worker}/claim", json={"timeout_s": 0})
    assert len(claimed.json()["invocations"]) == 1
    admitted = await asyncio.wait_for(waiting, timeout=10)
    assert admitted.status_code == 201


async def test_block_gives_up_after_its_wait(api: httpx.AsyncClient) -> None:
    await queue(api, max_depth=1, on_full="block")
    await submit(api)
    refused = await submit(api, wait_s=0.2)
    assert refused.status_code == 429
    assert "on_full: block" in refused.json()["error"]["message"]


async def test_rate_limit_answers_429_with_retry_after(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    await queue(api, rate_limit=2)
    assert [(await submit(api)).status_code for _ in range(2)] == [201, 201]
    refused = await submit(api)
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["field"] == "admission.rate_limit"
    clock.advance(0.5)
    assert (await submit(api)).status_code == 201
    assert (await submit(api)).status_code == 429
    assert await pending(api) == 3


async def test_work_past_its_deadline_is_expired_not_dispatched(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    await queue(api, deadline_cutoff_s=10)
    late = (await submit(api)).json()
    clock.advance(11)
    fresh = (await submit(api)).json()
    worker = (await api.post("/v1/workers/hello", json={"queues": ["q"]})).json()["id"]
    claimed = (await api.post(f"/v1/workers/{worker}/claim", json={"timeout_s": 0})).json()
    assert [i["id"] for i in claimed["invocations"]] == [fresh["id"]]
    expired = (await api.get(f"{NS}/invocations/{late['id']}")).json()
    assert (expired["state"], expired["error"]["type"]) == ("expired", "DeadlineExpired")


async def test_concurrent_submits_never_overfill_a_queue(api: httpx.AsyncClient) -> None:
    await queue(api, max_depth=5, on_full="reject")
    answers = await asyncio.gather(*(submit(api) for _ in range(40)))
    codes = sorted(response.status_code for response in answers)
    assert codes == [201] * 5 + [429] * 35
    assert await pending(api) == 5


async def test_concurrent_blocked_submits_are_admitted_as_room_is_made(
    api: httpx.AsyncClient,
) -> None:
    await queue(api, max_depth=2, on_full="block")
    submits = [asyncio.create_task(submit(api, wait_s=30)) for _ in range(6)]
    worker = (await api.post("/v1/workers/hello", json={"queues": ["q"]})).json()["id"]
    claimed = 0
    for _ in range(20):  # bounded: each claim takes one, waiting for a parked submit
        assert await pending(api) <= 2
        if claimed == 6:
            break
        answer = await api.post(f"/v1/workers/{worker}/claim", json={"timeout_s": 5})
        taken = answer.json()["invocations"]
        claimed += len(taken)
        for invocation in taken:
            done = {"result": None}
            path = f"/v1/workers/{worker}/invocations/{invocation['id']}/complete"
            assert (await api.post(path, json=done)).status_code == 200
    assert claimed == 6
    assert sorted(r.status_code for r in await asyncio.gather(*submits)) == [201] * 6


async def test_the_reaper_expires_overdue_work_no_claim_looks_at(
    api: httpx.AsyncClient, store: Store, clock: FakeClock
) -> None:
    await queue(api, deadline_cutoff_s=10)
    other = {"name": "slow", "admission": {"deadline_cutoff_s": 30}}
    assert (await api.post(f"{NS}/queues", json=other)).status_code == 201
    plain = await api.post(f"{NS}/queues/plain/invocations", json={"fn": "m:f"})
    started = (await submit(api, max_attempts=3)).json()
    worker = (await api.post("/v1/workers/hello", json={"queues": ["q"]})).json()["id"]
    [claimed] = (await api.post(f"/v1/workers/{worker}/claim", json={"timeout_s": 0})).json()[
        "invocations"
    ]
    assert claimed["id"] == started["id"]
    error = {"error": {"type": "ValueError", "message": "again"}}
    back = await api.post(f"/v1/workers/{worker}/invocations/{started['id']}/fail", json=error)
    assert back.json()["state"] == "pending"  # waiting out its backoff: started, so kept
    late = (await submit(api)).json()
    slow = (await api.post(f"{NS}/queues/slow/invocations", json={"fn": "m:f"})).json()
    clock.advance(11)  # past q's cutoff, within slow's
    fresh = (await submit(api)).json()

    swept = await reaper.reap(store, clock())

    assert swept["expired"] == 1

    async def state(invocation_id: str) -> tuple[str, str | None]:
        row = (await api.get(f"{NS}/invocations/{invocation_id}")).json()
        return row["state"], (row["error"] or {}).get("message")

    assert await state(late["id"]) == ("expired", "not started within 10 s")
    assert await state(started["id"]) == ("pending", "again")
    assert (await state(slow["id"]))[0] == "pending"
    assert (await state(fresh["id"]))[0] == "pending"
    assert (await state(plain.json()["id"]))[0] == "pending"
    clock.advance(20)  # past slow's cutoff too
    assert (await reaper.reap(store, clock()))["expired"] == 2  # slow's and fresh
    assert await state(slow["id"]) == ("expired", "not started within 30 s")
    assert await state(started["id"]) == ("pending", "again")


async def test_a_repeated_key_is_answered_even_when_the_rate_limit_is_spent(
    api: httpx.AsyncClient,
) -> None:
    await queue(api, rate_limit=1)
    body = {"fn": "m:f", "key": "k1"}
    first = await api.post(f"{NS}/queues/q/invocations", json=body)
    assert first.status_code == 201
    again = await api.post(f"{NS}/queues/q/invocations", json=body)
    assert (again.status_code, again.json()["id"]) == (200, first.json()["id"])
    batch = {"invocations": [body, body]}
    repeated = await api.post(f"{NS}/queues/q/invocations/batch", json=batch)
    assert repeated.status_code == 201
    assert repeated.json()["created"] == [False, False]
    assert (await submit(api)).status_code == 429  # new work is still paced
    assert await pending(api) == 1
