"""Workers: hello, claims in each discipline, leases, completion, failure, the reaper."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI
from sqlalchemy import insert, text

from lakeshore.api.app import begin_stopping, create_app
from lakeshore.config import Settings
from lakeshore.services.taskqueue import reaper
from lakeshore.services.taskqueue import workers as worker_service
from lakeshore.services.taskqueue.handoff import Waiting
from lakeshore.store import invocations as inv_store
from lakeshore.store.engine import Store
from lakeshore.store.tables import retired_workers
from tests.conftest import ADMIN, FakeClock

NS = "/v1/namespaces/default"
W = "/v1/workers"


async def hello(api: httpx.AsyncClient, queues: list[str], capacity: int = 4, **extra: Any) -> str:
    body = {"queues": queues, "capabilities": {"max_invocations": capacity}, **extra}
    response = await api.post(f"{W}/hello", json=body)
    assert response.status_code == 200, response.text
    return str(response.json()["id"])


async def submit(api: httpx.AsyncClient, queue: str, **body: Any) -> dict[str, Any]:
    response = await api.post(f"{NS}/queues/{queue}/invocations", json={"fn": "m:f", **body})
    assert response.status_code == 201, response.text
    return dict(response.json())


async def claim(api: httpx.AsyncClient, worker: str, **body: Any) -> list[dict[str, Any]]:
    response = await api.post(f"{W}/{worker}/claim", json={"timeout_s": 0, **body})
    assert response.status_code == 200, response.text
    return list(response.json()["invocations"])


async def test_hello_registers_and_empty_queues_mean_default(api: httpx.AsyncClient) -> None:
    response = await api.post(f"{W}/hello", json={"capabilities": {"max_invocations": 2}})
    body = response.json()
    assert body["queues"] == ["default"]
    assert body["lease_s"] == worker_service.LEASE_S
    stats = (await api.get(f"{NS}/queues/default/stats")).json()
    assert (stats["daemonCount"], stats["capacity"]) == (1, 2)


async def test_hello_again_refreshes_instead_of_duplicating(api: httpx.AsyncClient) -> None:
    worker = await hello(api, ["a"], id="w-1")
    assert await hello(api, ["a", "b"], id="w-1", capacity=8) == worker
    a = (await api.get(f"{NS}/queues/a/stats")).json()
    b = (await api.get(f"{NS}/queues/b/stats")).json()
    assert (a["daemonCount"], a["capacity"], b["daemonCount"]) == (1, 8, 1)


async def test_a_retired_worker_is_refused_at_hello(
    api: httpx.AsyncClient, store: Store, clock: FakeClock
) -> None:
    ns_id = (await api.get(f"{NS}/queues")).status_code and (
        (await api.get("/v1/namespaces")).json()["namespaces"][0]["id"]
    )
    async with store.write() as conn:
        await conn.execute(
            insert(retired_workers).values(
                id="w-old", name="w-old", namespace_id=ns_id, retired_at=clock.now
            )
        )
    response = await api.post(f"{W}/hello", json={"id": "w-old"})
    assert response.status_code == 410
    assert (await api.post(f"{W}/w-old/claim", json={"timeout_s": 0})).status_code == 410


async def test_an_unknown_worker_cannot_claim(api: httpx.AsyncClient) -> None:
    response = await api.post(f"{W}/w-nobody/claim", json={"timeout_s": 0})
    assert response.status_code == 404
    assert "hello" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("kind", "expected"),
    [("fifo", [0, 1, 2, 3]), ("filo", [3, 2, 1, 0]), ("priority", [2, 0, 3, 1])],
)
async def test_claims_follow_the_queue_discipline(
    api: httpx.AsyncClient, clock: FakeClock, kind: str, expected: list[int]
) -> None:
    await api.post(f"{NS}/queues", json={"name": "q", "kind": kind})
    for i, priority in enumerate([5, 1, 9, 5]):  # fifo among equals: 0 before 3
        await submit(api, "q", args=[i], kwargs={"priority": priority})
        clock.advance(1)
    worker = await hello(api, ["q"], capacity=1)
    order = []
    for _ in range(4):
        [got] = await claim(api, worker)
        order.append(got["args"][0])
        done = await api.post(
            f"{W}/{worker}/invocations/{got['id']}/complete", json={"result": None}
        )
        assert done.status_code == 200
    assert order == expected


@pytest.mark.parametrize(
    ("kind", "expected"),
    [("fifo", [0, 1, 2, 3]), ("filo", [3, 2, 1, 0]), ("priority", [2, 0, 3, 1])],
)
async def test_one_claim_of_several_comes_in_the_discipline_s_order(
    api: httpx.AsyncClient, clock: FakeClock, kind: str, expected: list[int]
) -> None:
    await api.post(f"{NS}/queues", json={"name": "q", "kind": kind})
    for i, priority in enumerate([5, 1, 9, 5]):
        await submit(api, "q", args=[i], kwargs={"priority": priority})
        clock.advance(1)
    worker = await hello(api, ["q"], capacity=4)
    got = await claim(api, worker)
    assert [g["args"][0] for g in got] == expected


async def test_a_claim_leases_no_more_than_it_asks_for(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    for i in range(30):
        await submit(api, "q", args=[i])
        clock.advance(1)
    worker = await hello(api, ["q"], capacity=16)
    got = await claim(api, worker, max=3)
    assert [g["args"][0] for g in got] == [0, 1, 2]
    stats = (await api.get(f"{NS}/queues/q/stats")).json()["byState"]
    assert (stats["running"], stats["pending"]) == (3, 27)


async def test_priority_field_comes_from_kind_params(api: httpx.AsyncClient) -> None:
    await api.post(
        f"{NS}/queues",
        json={"name": "q", "kind": "priority", "kindParams": {"priority_field": "urgency"}},
    )
    await submit(api, "q", args=["low"], kwargs={"urgency": 1, "priority": 100})
    await submit(api, "q", args=["high"], kwargs={"urgency": 7})
    worker = await hello(api, ["q"], capacity=1)
    assert [i["args"] for i in await claim(api, worker)] == [["high"]]


async def test_a_claim_takes_up_to_free_capacity_in_one_batch(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    for i in range(10):
        await submit(api, "q", args=[i])
        clock.advance(0.001)
    worker = await hello(api, ["q"], capacity=4)
    first = await claim(api, worker)
    assert [i["args"][0] for i in first] == [0, 1, 2, 3]
    assert all(
        i["state"] == "running" and i["worker"] == worker and i["attempts"] == 1 for i in first
    )
    assert await claim(api, worker) == []  # full
    await api.post(f"{W}/{worker}/invocations/{first[0]['id']}/complete", json={"result": 1})
    assert [i["args"][0] for i in await claim(api, worker)] == [4]
    assert [i["args"][0] for i in await claim(api, worker, max=0)] == []


async def test_a_paused_queue_dispatches_nothing_and_a_draining_one_does(
    api: httpx.AsyncClient,
) -> None:
    await submit(api, "p")
    await submit(api, "d")
    await api.post(f"{NS}/queues/p/pause")
    await api.post(f"{NS}/queues/d/drain")
    worker = await hello(api, ["p", "d"])
    assert [i["queue"] for i in await claim(api, worker)] == ["d"]


@pytest.fixture
def rare_recheck_app(settings: Settings, clock: FakeClock) -> FastAPI:
    return create_app(settings.model_copy(update={"claim_recheck_s": 60.0}), clock=clock)


@pytest.fixture
async def rare_recheck_api(rare_recheck_app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """The API with a fallback re-check (60 s) far past any wait of these tests: only a
    wake-up can answer a waiting claim in time."""
    async with LifespanManager(rare_recheck_app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://lakeshore.test", headers=ADMIN
        ) as client:
            yield client


async def test_a_waiting_claim_wakes_when_work_arrives(
    rare_recheck_api: httpx.AsyncClient,
) -> None:
    api = rare_recheck_api
    worker = await hello(api, ["q"])
    await submit(api, "q")  # makes the queue exist
    [first] = await claim(api, worker)
    waiting = asyncio.create_task(api.post(f"{W}/{worker}/claim", json={"timeout_s": 20}))
    await asyncio.sleep(0.05)  # let the claim start waiting (a real concurrent client)
    assert not waiting.done()
    later = await submit(api, "q")
    response = await asyncio.wait_for(waiting, timeout=10)  # the re-check is 60 s away
    assert [i["id"] for i in response.json()["invocations"]] == [later["id"]]
    assert first["id"] != later["id"]


async def test_only_the_holder_completes_and_only_once(api: httpx.AsyncClient) -> None:
    await submit(api, "q")
    holder = await hello(api, ["q"])
    other = await hello(api, ["q"])
    [got] = await claim(api, holder)
    url = f"/invocations/{got['id']}/complete"
    refused = await api.post(f"{W}/{other}{url}", json={"result": "stolen"})
    assert refused.status_code == 409
    done = await api.post(f"{W}/{holder}{url}", json={"result": {"answer": 42}})
    assert (done.json()["state"], done.json()["result"]) == ("succeeded", {"answer": 42})
    again = await api.post(f"{W}/{holder}{url}", json={"result": "twice"})
    assert again.status_code == 409
    stored = (await api.get(f"{NS}/invocations/{got['id']}")).json()
    assert stored["result"] == {"answer": 42}


async def test_a_retried_failure_waits_its_backoff_then_runs_again(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    created = await submit(api, "q", max_attempts=2)
    worker = await hello(api, ["q"])
    [got] = await claim(api, worker)
    error = {"type": "ValueError", "message": "bad input", "traceback": "Traceback ..."}
    failed = await api.post(f"{W}/{worker}/invocations/{got['id']}/fail", json={"error": error})
    assert (failed.json()["state"], failed.json()["attempts"]) == ("pending", 1)
    assert failed.json()["error"]["type"] == "ValueError"
    assert await claim(api, worker) == []  # backing off
    clock.advance(worker_service.LEASE_S)
    [again] = await claim(api, worker)
    assert (again["id"], again["attempts"]) == (created["id"], 2)
    final = await api.post(f"{W}/{worker}/invocations/{again['id']}/fail", json={"error": error})
    assert (final.json()["state"], final.json()["attempts"]) == ("failed", 2)


@pytest.mark.parametrize("batched", [False, True])
async def test_a_success_after_a_failed_attempt_carries_no_error(
    api: httpx.AsyncClient, clock: FakeClock, batched: bool
) -> None:
    await submit(api, "q", max_attempts=2)
    worker = await hello(api, ["q"])
    [got] = await claim(api, worker)
    error = {"type": "ValueError", "message": "flaky"}
    await api.post(f"{W}/{worker}/invocations/{got['id']}/fail", json={"error": error})
    clock.advance(worker_service.LEASE_S)
    [again] = await claim(api, worker)
    if batched:
        body = {"results": [{"id": again["id"], "result": 7}], "claim": 0}
        answer = await api.post(f"{W}/{worker}/results", json=body)
        assert answer.status_code == 200, answer.text
    else:
        answer = await api.post(
            f"{W}/{worker}/invocations/{again['id']}/complete", json={"result": 7}
        )
        assert answer.status_code == 200, answer.text
    done = (await api.get(f"{NS}/invocations/{again['id']}")).json()
    assert (done["state"], done["result"], done["error"]) == ("succeeded", 7, None)


async def test_an_empty_claim_says_when_pending_work_may_be_claimed(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    worker = await hello(api, ["q"])
    await submit(api, "other")  # another queue's work is not this worker's
    empty = await api.post(f"{W}/{worker}/claim", json={"timeout_s": 0})
    assert empty.json() == {"invocations": [], "next_in_s": None}
    await submit(api, "q", max_attempts=2, retry={"jitter": False})  # a wait of exactly 1 s
    [got] = await claim(api, worker)
    error = {"type": "ValueError", "message": "bad input"}
    await api.post(f"{W}/{worker}/invocations/{got['id']}/fail", json={"error": error})
    clock.advance(0.25)
    backing_off = await api.post(f"{W}/{worker}/claim", json={"timeout_s": 0})
    assert backing_off.json() == {"invocations": [], "next_in_s": 0.75}  # a 1 s backoff
    clock.advance(1)
    [again] = await claim(api, worker)
    assert again["id"] == got["id"]
    await submit(api, "q")
    assert (await api.post(f"{NS}/queues/q/pause")).status_code == 200
    paused = await api.post(f"{W}/{worker}/claim", json={"timeout_s": 0})
    assert paused.json() == {"invocations": [], "next_in_s": None}  # nothing it may take


async def test_a_failure_without_retry_is_final(api: httpx.AsyncClient) -> None:
    await submit(api, "q", max_attempts=5)
    worker = await hello(api, ["q"])
    [got] = await claim(api, worker)
    body = {"error": {"type": "Fatal", "message": "no"}, "retry": False}
    failed = await api.post(f"{W}/{worker}/invocations/{got['id']}/fail", json=body)
    assert failed.json()["state"] == "failed"


async def test_an_expired_lease_returns_to_pending_then_fails_when_spent(
    api: httpx.AsyncClient, store: Store, clock: FakeClock
) -> None:
    created = await submit(api, "q", max_attempts=2)
    dead = await hello(api, ["q"])
    [got] = await claim(api, dead)
    clock.advance(worker_service.LEASE_S + 1)
    assert (await reaper.reap(store, clock()))["retried"] == 1
    clock.advance(60)
    alive = await hello(api, ["q"])
    [again] = await claim(api, alive)
    assert (again["id"], again["attempts"]) == (created["id"], 2)
    late = await api.post(f"{W}/{dead}/invocations/{got['id']}/complete", json={"result": "late"})
    assert late.status_code in (404, 409)  # dropped as silent, or no longer the holder
    clock.advance(worker_service.LEASE_S + 1)
    assert (await reaper.reap(store, clock()))["failed"] == 1
    final = (await api.get(f"{NS}/invocations/{created['id']}")).json()
    assert (final["state"], final["error"]["type"]) == ("failed", "LeaseExpired")


async def test_one_sweep_fails_spent_leases_and_backs_off_each_by_its_attempt(
    api: httpx.AsyncClient, store: Store, clock: FakeClock
) -> None:
    exact = {"jitter": False}  # each wait its bound: 1 s after the first attempt, 2 s after
    b = await submit(api, "sweep", max_attempts=3, retry=exact)
    worker = await hello(api, ["sweep"])
    await claim(api, worker)
    clock.advance(worker_service.LEASE_S + 1)
    assert (await reaper.reap(store, clock()))["retried"] == 1
    clock.advance(1)
    a = await submit(api, "sweep", max_attempts=1, retry=exact)
    c = await submit(api, "sweep", max_attempts=3, retry=exact)
    leased = {i["id"]: i["attempts"] for i in await claim(api, worker)}
    assert leased == {a["id"]: 1, b["id"]: 2, c["id"]: 1}

    clock.advance(worker_service.LEASE_S + 1)
    assert await reaper.reap(store, clock()) == {
        "retried": 2,
        "failed": 1,
        "returned": 0,
        "expired": 0,
        "workers_dropped": 0,
    }
    failed = (await api.get(f"{NS}/invocations/{a['id']}")).json()
    assert (failed["state"], failed["error"]["type"]) == ("failed", "LeaseExpired")
    assert await claim(api, worker) == []
    clock.advance(1)  # c's backoff after its first attempt
    assert [i["id"] for i in await claim(api, worker)] == [c["id"]]
    clock.advance(1)  # b's after its second
    assert [i["id"] for i in await claim(api, worker)] == [b["id"]]


async def test_heartbeats_keep_a_lease(
    api: httpx.AsyncClient, store: Store, clock: FakeClock
) -> None:
    await submit(api, "q")
    worker = await hello(api, ["q"])
    [got] = await claim(api, worker)
    for _ in range(5):
        clock.advance(worker_service.LEASE_S - 5)
        beat = await api.post(f"{W}/{worker}/heartbeat")
        assert beat.json()["held"] == [got["id"]]
        assert (await reaper.reap(store, clock()))["retried"] == 0
    done = await api.post(f"{W}/{worker}/invocations/{got['id']}/complete", json={"result": 1})
    assert done.status_code == 200


async def test_what_a_daemon_holds_without_running_goes_back_at_its_heartbeat(
    api: httpx.AsyncClient, store: Store, clock: FakeClock
) -> None:
    """A claim's answer lost (the server died as it answered): the daemon never runs
    those invocations; its heartbeat lists what it runs, and the rest go back to the
    queue without spending an attempt, while its other leases are kept."""
    for n in range(3):
        await submit(api, "lost", key=f"k{n}")
    worker = await hello(api, ["lost"])
    runs, *lost = await claim(api, worker, max=3)

    clock.advance(10)  # within a lease of the claim: its answer may still be on its way
    beat = await api.post(f"{W}/{worker}/heartbeat", json={"running": [runs["id"]]})
    assert (beat.json()["held"], beat.json()["released"]) == (
        sorted(i["id"] for i in (runs, *lost)),
        0,
    )

    clock.advance(worker_service.LEASE_S)
    beat = await api.post(f"{W}/{worker}/heartbeat", json={"running": [runs["id"]]})
    assert (beat.json()["held"], beat.json()["released"]) == ([runs["id"]], 2)
    assert (await reaper.reap(store, clock()))["retried"] == 0

    other = await hello(api, ["lost"])
    again = await claim(api, other, max=3)
    assert sorted((i["id"], i["attempts"]) for i in again) == sorted((i["id"], 1) for i in lost)
    done = await api.post(f"{W}/{worker}/invocations/{runs['id']}/complete", json={"result": 1})
    assert done.status_code == 200


@pytest.mark.parametrize(
    "body",
    [{"running": "inv_1"}, {"running": [1]}, {"runnin": []}, {"running": ["x" * 65]}, []],
)
async def test_a_malformed_heartbeat_is_refused_and_changes_nothing(
    api: httpx.AsyncClient, body: Any
) -> None:
    await submit(api, "q")
    worker = await hello(api, ["q"])
    [got] = await claim(api, worker)
    beat = await api.post(f"{W}/{worker}/heartbeat", json=body)
    assert beat.status_code == 422, beat.text
    assert (await api.get(f"{NS}/invocations/{got['id']}")).json()["worker"] == worker


async def test_a_cancelled_invocation_leaves_the_holder(api: httpx.AsyncClient) -> None:
    await submit(api, "q")
    worker = await hello(api, ["q"])
    [got] = await claim(api, worker)
    await api.post(f"{NS}/invocations/{got['id']}/cancel")
    assert (await api.post(f"{W}/{worker}/heartbeat")).json()["held"] == []
    late = await api.post(f"{W}/{worker}/invocations/{got['id']}/complete", json={"result": 1})
    assert late.status_code == 409


async def test_silent_workers_are_dropped(
    api: httpx.AsyncClient, store: Store, clock: FakeClock
) -> None:
    worker = await hello(api, ["q"])
    clock.advance(reaper.WORKER_TTL_S + 1)
    assert (await reaper.reap(store, clock()))["workers_dropped"] == 1
    assert (await api.post(f"{W}/{worker}/claim", json={"timeout_s": 0})).status_code == 404


async def test_a_batch_is_claimed_in_submit_order(api: httpx.AsyncClient) -> None:
    batch = [{"fn": "m:f", "args": [i]} for i in range(8)]
    await api.post(f"{NS}/queues/q/invocations/batch", json={"invocations": batch})
    worker = await hello(api, ["q"], capacity=8)
    assert [i["args"][0] for i in await claim(api, worker)] == list(range(8))


async def test_racing_claimers_never_share_an_invocation(api: httpx.AsyncClient) -> None:
    batch = [{"fn": "m:f", "args": [i]} for i in range(60)]
    await api.post(f"{NS}/queues/q/invocations/batch", json={"invocations": batch})
    workers = [await hello(api, ["q"], capacity=10) for _ in range(6)]
    results = await asyncio.gather(*(claim(api, w) for w in workers))
    ids = [i["id"] for claimed in results for i in claimed]
    assert len(ids) == len(set(ids)) == 60
    assert sorted(i["args"][0] for claimed in results for i in claimed) == list(range(60))
    for worker, claimed in zip(workers, results, strict=True):
        assert all(i["worker"] == worker for i in claimed)


async def test_a_worker_of_another_namespace_is_404(api: httpx.AsyncClient) -> None:
    worker = await hello(api, ["q"])
    await api.post("/v1/namespaces", json={"name": "team-b"})
    token = (await api.post("/v1/namespaces/team-b/tokens", json={})).json()["token"]
    other = {"Authorization": f"Bearer {token}"}
    response = await api.post(f"{W}/{worker}/claim", json={"timeout_s": 0}, headers=other)
    assert response.status_code == 404


async def test_a_namespace_token_hellos_into_its_own_namespace(api: httpx.AsyncClient) -> None:
    await api.post("/v1/namespaces", json={"name": "team-b"})
    token = (await api.post("/v1/namespaces/team-b/tokens", json={})).json()["token"]
    other = {"Authorization": f"Bearer {token}"}
    body = (await api.post(f"{W}/hello", json={"queues": ["gpu"]}, headers=other)).json()
    assert body["namespace"] == "team-b"
    refused = await api.post(f"{W}/hello", json={"namespace": "default"}, headers=other)
    assert refused.status_code == 403


@pytest.mark.parametrize(
    "body",
    [
        {"capabilities": {"max_invocations": 0}},
        {"queues": ["Bad Name"]},
        {"id": "a/b"},
        {"unknown": 1},
        ["not", "an", "object"],
    ],
)
async def test_bad_hellos_are_422(api: httpx.AsyncClient, body: Any) -> None:
    assert (await api.post(f"{W}/hello", json=body)).status_code == 422


async def test_unstorable_results_are_refused_and_change_nothing(api: httpx.AsyncClient) -> None:
    await submit(api, "q")
    worker = await hello(api, ["q"])
    [got] = await claim(api, worker)
    raw = b'{"result": [NaN]}'
    url = f"{W}/{worker}/invocations/{got['id']}/complete"
    response = await api.post(url, content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert (await api.get(f"{NS}/invocations/{got['id']}")).json()["state"] == "running"


async def test_a_boltzmann_queue_favours_high_priority_but_serves_all(
    api: httpx.AsyncClient,
) -> None:
    await api.post(
        f"{NS}/queues", json={"name": "b", "kind": "boltzmann", "kindParams": {"temperature": 0.05}}
    )
    batch = [{"fn": "m:f", "args": [i], "kwargs": {"priority": i}} for i in range(10)]
    await api.post(f"{NS}/queues/b/invocations/batch", json={"invocations": batch})
    worker = await hello(api, ["b"], capacity=1)
    order = []
    for _ in range(10):
        [got] = await claim(api, worker)
        order.append(got["args"][0])
        await api.post(f"{W}/{worker}/invocations/{got['id']}/complete", json={"result": None})
    assert sorted(order) == list(range(10))
    assert order[0] == 9  # at T=0.05 the top priority outweighs the next by e^20


async def test_bye_hands_back_held_work_without_spending_an_attempt(
    api: httpx.AsyncClient,
) -> None:
    worker = await hello(api, ["bye"])
    invocation = await submit(api, "bye")
    [claimed] = await claim(api, worker)
    assert claimed["attempts"] == 1
    response = await api.post(f"{W}/{worker}/bye")
    assert response.json() == {"released": 1}
    back = (await api.get(f"{NS}/invocations/{invocation['id']}")).json()
    assert (back["state"], back["attempts"], back["worker"]) == ("pending", 0, None)
    stats = (await api.get(f"{NS}/queues/bye/stats")).json()
    assert stats["daemonCount"] == 0
    assert (await api.post(f"{W}/{worker}/claim", json={})).status_code == 404
    other = await hello(api, ["bye"])
    [again] = await claim(api, other)
    assert (again["id"], again["attempts"]) == (invocation["id"], 1)


async def test_a_claim_whose_caller_hung_up_leases_nothing(
    api: httpx.AsyncClient, store: Store, clock: FakeClock
) -> None:
    """The hang-up ends the long-poll before anything is leased to a gone caller."""
    from lakeshore.services.auth import ADMIN as ADMIN_PRINCIPAL
    from lakeshore.services.taskqueue.notify import Hangup, Notifier

    worker = await hello(api, ["hangup"])
    gone = Hangup()
    gone.set()
    await submit(api, "hangup")
    claimed = await worker_service.claim(
        store,
        Notifier(),
        ADMIN_PRINCIPAL,
        worker,
        timeout_s=5,
        max_count=None,
        clock=clock,
        gone=gone,
    )
    assert claimed == []
    assert len(await claim(api, worker)) == 1  # still pending, so a live claim gets it


async def test_a_claim_counts_what_its_worker_runs_after_taking_the_workers_row(
    api: httpx.AsyncClient, store: Store
) -> None:
    """PostgreSQL, where claims of one worker run at once (its long-poll, the claims its
    reports carry): a claim counts what the worker runs only once it holds the worker's
    row. Here another transaction holds that row and leases three invocations to the
    worker while the claim waits for it; the claim then finds one slot free of four, not
    four."""
    if store.dialect != "postgresql":
        pytest.skip("SQLite has one writer at a time: claims of one worker never overlap")
    batch = [{"fn": "m:f", "args": [i]} for i in range(10)]
    await api.post(f"{NS}/queues/q/invocations/batch", json={"invocations": batch})
    worker = await hello(api, ["q"], capacity=4)
    async with store.engine.connect() as other:
        key = (
            await other.execute(
                text("UPDATE workers SET last_seen_at = now() WHERE name = :n RETURNING id"),
                {"n": worker},
            )
        ).scalar_one()
        claiming = asyncio.create_task(claim(api, worker))
        async with store.engine.connect() as watch:
            for _ in range(500):  # bounded: until the claim waits for the worker's row
                waiting = await watch.execute(
                    text(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                        " AND datname = current_database()"
                    )
                )
                if waiting.scalar_one():
                    break
                await asyncio.sleep(0.01)
            else:
                pytest.fail("the claim never waited for the worker's row")
            await watch.commit()
        await other.execute(
            text(
                "UPDATE invocations SET state = 'running', worker_id = :w, attempts = 1,"
                " started_at = now(), lease_expires_at = now() + interval '1 minute'"
                " WHERE id IN (SELECT id FROM invocations WHERE state = 'pending'"
                " ORDER BY created_at LIMIT 3)"
            ),
            {"w": key},
        )
        await other.commit()
        claimed = await claiming
    assert len(claimed) == 1


# --- a submit handed to a waiting claim (services/taskqueue/handoff.py) -------------------------


@pytest.fixture
def room(rare_recheck_app: FastAPI, rare_recheck_api: httpx.AsyncClient) -> Waiting:
    """The claims waiting in ``rare_recheck_api``'s server."""
    waiting: Waiting = rare_recheck_app.state.lakeshore.waiting
    return waiting


async def waiting_claim(
    api: httpx.AsyncClient, room: Waiting, worker: str, queue_id: str, timeout_s: float = 20
) -> asyncio.Task[httpx.Response]:
    """A long-poll claim of ``worker``, once it waits on ``queue_id``."""
    body = {"timeout_s": timeout_s}
    task = asyncio.create_task(api.post(f"{W}/{worker}/claim", json=body))
    for _ in range(500):  # bounded: until the claim waits
        if room.on(queue_id):
            return task
        assert not task.done(), task.result().text
        await asyncio.sleep(0.01)
    task.cancel()
    pytest.fail("the claim never waited")


async def queue_id_of(api: httpx.AsyncClient, name: str) -> str:
    return str((await api.get(f"{NS}/queues/{name}")).json()["id"])


async def test_a_submit_is_handed_to_the_claim_waiting_on_its_queue(
    rare_recheck_api: httpx.AsyncClient, room: Waiting, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The invocation goes in leased to the waiting worker, and the claim answers with
    it without a claim of its own."""
    api = rare_recheck_api
    worker = await hello(api, ["q"])
    await submit(api, "q")  # makes the queue, known to the server from now on
    [first] = await claim(api, worker)
    leases: list[str] = []
    real = inv_store.claim

    async def spy(*args: Any, **kwargs: Any) -> Any:
        leases.append(kwargs["queue_id"])
        return await real(*args, **kwargs)

    monkeypatch.setattr(inv_store, "claim", spy)
    waiting = await waiting_claim(api, room, worker, await queue_id_of(api, "q"))
    leases.clear()  # the claim looked before it waited
    handed = await submit(api, "q", args=[7])
    answer = await asyncio.wait_for(waiting, timeout=10)  # the re-check is 60 s away
    [got] = answer.json()["invocations"]
    read = (await api.get(f"{NS}/invocations/{handed['id']}")).json()
    assert handed == got == read
    assert (got["state"], got["attempts"], got["args"]) == ("running", 1, [7])
    assert got["worker"] == first["worker"]
    assert got["started_at"] == got["created_at"]
    assert leases == []  # no claim statement ran since
    done = await api.post(f"{W}/{worker}/invocations/{got['id']}/complete", json={"result": 1})
    assert done.json()["state"] == "succeeded"


@pytest.fixture
async def answers_sent(
    rare_recheck_app: FastAPI,
) -> AsyncIterator[tuple[httpx.AsyncClient, Waiting, list[str]]]:
    """Like ``rare_recheck_api``, with the path of each answer in the order the server
    began to send them."""
    sent: list[str] = []
    async with LifespanManager(rare_recheck_app) as manager:
        inner = manager.app

        async def recording(scope: Any, receive: Any, send: Any) -> None:
            async def sending(message: Any) -> None:
                if message["type"] == "http.response.start":
                    sent.append(scope["path"])
                await send(message)

            await inner(scope, receive, sending)

        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=recording),
            base_url="http://lakeshore.test",
            headers=ADMIN,
        ) as client:
            yield client, rare_recheck_app.state.lakeshore.waiting, sent


async def test_a_handed_claims_answer_goes_out_before_the_submitters(
    answers_sent: tuple[httpx.AsyncClient, Waiting, list[str]],
) -> None:
    """The claim's answer starts the work: the server sends it before it answers the
    submit that handed it the invocation."""
    api, room, sent = answers_sent
    worker = await hello(api, ["q"])
    await submit(api, "q")  # makes the queue, known to the server from now on
    await claim(api, worker)
    waiting = await waiting_claim(api, room, worker, await queue_id_of(api, "q"))
    sent.clear()
    handed = await submit(api, "q", args=[1])
    answer = await asyncio.wait_for(waiting, timeout=10)
    assert [i["id"] for i in answer.json()["invocations"]] == [handed["id"]]
    assert sent == [f"{W}/{worker}/claim", f"{NS}/queues/q/invocations"]


async def test_a_worker_that_holds_all_it_may_is_handed_nothing(
    rare_recheck_api: httpx.AsyncClient,
    room: Waiting,
) -> None:
    api = rare_recheck_api
    worker = await hello(api, ["q"], capacity=1)
    await submit(api, "q")
    [held] = await claim(api, worker)
    waiting = await waiting_claim(api, room, worker, await queue_id_of(api, "q"), 0.5)
    later = await submit(api, "q")
    assert later["state"] == "pending"
    answer = await asyncio.wait_for(waiting, timeout=10)
    assert answer.json()["invocations"] == []  # still full when it ended
    await api.post(f"{W}/{worker}/invocations/{held['id']}/complete", json={"result": 1})
    assert [i["id"] for i in await claim(api, worker)] == [later["id"]]


async def test_work_not_due_in_the_queue_does_not_hold_back_a_hand_off(
    rare_recheck_api: httpx.AsyncClient, room: Waiting, clock: FakeClock
) -> None:
    """An invocation waiting out a retry's backoff is pending but not claimable: a new
    submit to its queue is handed to the waiting claim, as a claim would take it, and
    the retry is claimed once its backoff ends."""
    api = rare_recheck_api
    worker = await hello(api, ["q"])
    backing_off = await submit(api, "q", max_attempts=2)
    [got] = await claim(api, worker)
    error = {"type": "E", "message": "again"}
    await api.post(f"{W}/{worker}/invocations/{got['id']}/fail", json={"error": error})
    waiting = await waiting_claim(api, room, worker, await queue_id_of(api, "q"))
    later = await submit(api, "q")
    assert later["state"] == "running"
    answer = await asyncio.wait_for(waiting, timeout=10)
    assert [i["id"] for i in answer.json()["invocations"]] == [later["id"]]
    await api.post(f"{W}/{worker}/invocations/{later['id']}/complete", json={"result": 1})
    clock.advance(worker_service.LEASE_S)
    [again] = await claim(api, worker)
    assert again["id"] == backing_off["id"]


async def test_a_worker_whose_token_may_not_claim_there_is_handed_nothing(
    rare_recheck_api: httpx.AsyncClient,
) -> None:
    api = rare_recheck_api
    issued = (await api.post(f"{NS}/tokens", json={"name": "fleet"})).json()
    fleet = {"Authorization": f"Bearer {issued['token']}"}
    hello_body = {"queues": ["q"], "capabilities": {"max_invocations": 2}}
    worker = (await api.post(f"{W}/hello", json=hello_body, headers=fleet)).json()["id"]
    policy = {"authPolicy": {"claim": ["someone-else"]}}
    assert (await api.patch(f"{NS}/queues/q", json=policy)).status_code == 200
    known = await submit(api, "q")  # the server knows the queue as it now stands
    await api.post(f"{NS}/invocations/{known['id']}/cancel")  # nothing pending: only
    task = asyncio.create_task(  # the token's refusal keeps the next submit from it
        api.post(f"{W}/{worker}/claim", json={"timeout_s": 0.5}, headers=fleet)
    )
    await asyncio.sleep(0.05)  # the claim waits (on nothing it may take)
    later = await submit(api, "q")
    assert later["state"] == "pending"
    answer = await asyncio.wait_for(task, timeout=10)
    assert answer.json()["invocations"] == []


async def test_a_worker_row_held_elsewhere_sends_the_submit_in_pending_at_once(
    rare_recheck_api: httpx.AsyncClient, room: Waiting, store: Store
) -> None:
    """PostgreSQL: another transaction holds the worker's row (a claim or a retirement
    under way). The submit does not wait for it: its invocation goes in pending, and
    the claim takes it once the row is free."""
    if store.dialect != "postgresql":
        pytest.skip("SQLite has one writer at a time")
    api = rare_recheck_api
    worker = await hello(api, ["q"])
    await submit(api, "q")
    [_] = await claim(api, worker)
    waiting = await waiting_claim(api, room, worker, await queue_id_of(api, "q"))
    async with store.engine.connect() as other:
        await other.execute(
            text("UPDATE workers SET last_seen_at = now() WHERE name = :n"), {"n": worker}
        )
        later = await asyncio.wait_for(submit(api, "q"), timeout=10)
        assert later["state"] == "pending"
        await other.commit()
    answer = await asyncio.wait_for(waiting, timeout=10)
    assert [i["id"] for i in answer.json()["invocations"]] == [later["id"]]


async def test_a_server_that_begins_to_stop_answers_its_waiting_claims_at_once(
    rare_recheck_app: FastAPI, rare_recheck_api: httpx.AsyncClient, room: Waiting
) -> None:
    """A graceful stop waits for the requests still open: a claim waiting up to 20 s
    answers, with nothing, as the stop begins, and is handed nothing after it."""
    api = rare_recheck_api
    worker = await hello(api, ["q"])
    await submit(api, "q")  # makes the queue exist
    await claim(api, worker)
    waiting = await waiting_claim(api, room, worker, await queue_id_of(api, "q"))

    await begin_stopping(rare_recheck_app)
    async with asyncio.timeout(10):  # bounded: the claim itself would wait 20 s
        response = await waiting
    assert response.status_code == 200
    assert response.json()["invocations"] == []
    assert (await submit(api, "q"))["state"] == "pending"  # not handed to a claim that left


async def test_a_failure_before_the_stop_does_not_hold_it(
    rare_recheck_app: FastAPI,
    rare_recheck_api: httpx.AsyncClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What runs first as the server stops (``lakeshore up``'s daemons) may fail; the
    claims and streams still end, and the failure is logged."""

    async def failing() -> None:
        raise RuntimeError("the provider could not stop them")

    state = rare_recheck_app.state.lakeshore
    state.before_stop = failing
    await begin_stopping(rare_recheck_app)
    assert state.stopping.is_set()
    assert "stopping the local daemons failed" in caplog.text
    assert "the provider could not stop them" in caplog.text
