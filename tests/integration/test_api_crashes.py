"""What a daemon's death costs: only the attempts that began are charged, whether its
sentinel reports the crash (``POST /v1/workers/{id}/crashed``) or only the leases' expiry
tells (the reaper); the work it held without beginning goes back uncounted."""

from __future__ import annotations

from typing import Any

import httpx

from lakeshore.services.taskqueue import reaper
from lakeshore.services.taskqueue import workers as worker_service
from lakeshore.store.engine import Store
from tests.conftest import FakeClock
from tests.integration.test_api_workers import NS, W, claim, submit


async def hello(
    api: httpx.AsyncClient,
    queue: str,
    *,
    prefetch: int = 0,
    session: str | None = None,
    **more: Any,
) -> str:
    capabilities: dict[str, Any] = {"max_invocations": 1}
    if prefetch:
        capabilities["prefetch"] = prefetch
    if session:
        capabilities["session"] = session
    body = {"queues": [queue], "capabilities": capabilities, **more}
    response = await api.post(f"{W}/hello", json=body)
    assert response.status_code == 200, response.text
    return str(response.json()["id"])


async def invocation(api: httpx.AsyncClient, invocation_id: str) -> dict[str, Any]:
    return dict((await api.get(f"{NS}/invocations/{invocation_id}")).json())


async def crashed(api: httpx.AsyncClient, worker: str, **body: Any) -> dict[str, Any]:
    response = await api.post(f"{W}/{worker}/crashed", json=body)
    assert response.status_code == 200, response.text
    return dict(response.json())


async def test_a_crash_report_charges_what_began_and_returns_the_rest_at_once(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    ids = [(await submit(api, "crash", max_attempts=3))["id"] for _ in range(4)]
    dead = await hello(api, "crash", prefetch=3, session="s1")
    held = await claim(api, dead, max=4)
    assert {i["id"] for i in held} == set(ids)
    pill = ids[0]

    answer = await crashed(api, dead, started=[pill], session="s1")
    assert answer == {"retried": 1, "failed": 0, "released": 3, "gone": True}
    charged = await invocation(api, pill)
    assert (charged["state"], charged["attempts"], charged["error"]["type"]) == (
        "pending",
        1,
        "WorkerCrashed",
    )
    for other in ids[1:]:
        back = await invocation(api, other)
        assert (back["state"], back["attempts"], back["worker"]) == ("pending", 0, None)
    gone = await api.post(f"{W}/{dead}/claim", json={"timeout_s": 0})
    assert gone.status_code == 404  # the worker is gone, as after a bye

    rescuer = await hello(api, "crash", prefetch=3)
    again = await claim(api, rescuer, max=4)  # at once: no lease to wait out
    assert sorted((i["id"], i["attempts"]) for i in again) == sorted((i, 1) for i in ids[1:])
    clock.advance(2)  # the pill's backoff after its first attempt
    [retried] = await claim(api, rescuer, max=4)
    assert (retried["id"], retried["attempts"]) == (pill, 2)


async def test_a_crash_report_fails_a_begun_attempt_that_was_its_last(
    api: httpx.AsyncClient,
) -> None:
    pill = (await submit(api, "last", max_attempts=1))["id"]
    bystander = (await submit(api, "last", max_attempts=1))["id"]
    dead = await hello(api, "last", prefetch=1)
    await claim(api, dead, max=2)
    answer = await crashed(api, dead, started=[pill])
    assert answer == {"retried": 0, "failed": 1, "released": 1, "gone": True}
    failed = await invocation(api, pill)
    assert (failed["state"], failed["error"]["type"]) == ("failed", "WorkerCrashed")
    assert (await invocation(api, bystander))["state"] == "pending"


async def test_a_crash_report_charges_what_the_heartbeats_said_had_begun(
    api: httpx.AsyncClient,
) -> None:
    """The sentinel may not know what began (a report it could not read): what the
    daemon's heartbeats listed as running is charged all the same."""
    a, b, c = [(await submit(api, "beat", max_attempts=2))["id"] for _ in range(3)]
    dead = await hello(api, "beat", prefetch=2)
    await claim(api, dead, max=3)
    beat = await api.post(f"{W}/{dead}/heartbeat", json={"running": [a], "prefetched": [b, c]})
    assert beat.json()["held"] == sorted([a, b, c])
    answer = await crashed(api, dead)
    assert answer == {"retried": 1, "failed": 0, "released": 2, "gone": True}
    assert [(await invocation(api, i))["attempts"] for i in (a, b, c)] == [1, 0, 0]


async def test_a_crash_report_of_an_earlier_session_leaves_the_successor_its_row_and_leases(
    api: httpx.AsyncClient,
) -> None:
    """A daemon restarted with the same worker id says hello before its predecessor's
    sentinel reports: the report charges what the predecessor began, and nothing of
    the successor's."""
    ids = {(await submit(api, "same", max_attempts=3))["id"] for _ in range(2)}
    first = await hello(api, "same", prefetch=1, session="s1", id="w-same")
    [got] = await claim(api, first, max=1)
    pill = got["id"]
    second = await hello(api, "same", prefetch=1, session="s2", id="w-same")
    assert second == first
    [taken] = await claim(api, second, max=1)
    mine = taken["id"]
    assert {pill, mine} == ids

    answer = await crashed(api, first, started=[pill], session="s1")
    assert answer == {"retried": 1, "failed": 0, "released": 0, "gone": False}
    kept = await invocation(api, mine)
    assert (kept["state"], kept["worker"]) == ("running", "w-same")
    beat = await api.post(f"{W}/{second}/heartbeat", json={"running": [mine], "prefetched": []})
    assert beat.json()["held"] == [mine]


async def test_a_crash_report_changes_nothing_once_the_worker_is_gone(
    api: httpx.AsyncClient,
) -> None:
    await submit(api, "bye")
    worker = await hello(api, "bye")
    [got] = await claim(api, worker)
    assert (await api.post(f"{W}/{worker}/bye")).status_code == 200
    late = await api.post(f"{W}/{worker}/crashed", json={"started": [got["id"]]})
    assert late.status_code == 404
    assert (await invocation(api, got["id"]))["attempts"] == 0  # bye handed it back


async def test_a_malformed_crash_report_is_refused_and_changes_nothing(
    api: httpx.AsyncClient,
) -> None:
    await submit(api, "bad")
    worker = await hello(api, "bad")
    [got] = await claim(api, worker)
    for body in ({"started": got["id"]}, {"started": [1]}, {"session": ""}, {"x": 1}, []):
        refused = await api.post(f"{W}/{worker}/crashed", json=body)
        assert refused.status_code == 422, (body, refused.text)
    assert (await invocation(api, got["id"]))["worker"] == worker


async def test_an_expired_lease_that_never_began_returns_uncharged(
    api: httpx.AsyncClient, store: Store, clock: FakeClock
) -> None:
    """The whole machine gone, its sentinel with it: the leases run out, and the reaper
    charges only the attempt the heartbeats said had begun."""
    began, waiting = [(await submit(api, "machine", max_attempts=3))["id"] for _ in range(2)]
    dead = await hello(api, "machine", prefetch=1)
    await claim(api, dead, max=2)
    await api.post(f"{W}/{dead}/heartbeat", json={"running": [began], "prefetched": [waiting]})
    clock.advance(worker_service.LEASE_S + 1)
    assert (await reaper.reap(store, clock()))["retried"] == 1
    charged, back = await invocation(api, began), await invocation(api, waiting)
    assert (charged["state"], charged["attempts"], charged["error"]["type"]) == (
        "pending",
        1,
        "LeaseExpired",
    )
    assert (back["state"], back["attempts"], back["error"]) == ("pending", 0, None)
    rescuer = await hello(api, "machine")
    [again] = await claim(api, rescuer, max=2)  # the unbegun one at once
    assert (again["id"], again["attempts"]) == (waiting, 1)


async def test_an_older_daemon_s_heartbeat_counts_what_it_lists_as_begun(
    api: httpx.AsyncClient, store: Store, clock: FakeClock
) -> None:
    """A heartbeat without ``prefetched`` (a daemon that does not tell them apart): each
    lease it lists may have begun, and is charged when it runs out, as before."""
    ids = [(await submit(api, "older", max_attempts=3))["id"] for _ in range(2)]
    dead = await hello(api, "older", prefetch=1)
    await claim(api, dead, max=2)
    await api.post(f"{W}/{dead}/heartbeat", json={"running": ids})
    clock.advance(worker_service.LEASE_S + 1)
    assert (await reaper.reap(store, clock()))["retried"] == 2


async def test_an_attempt_handed_back_is_not_taken_for_begun_at_its_next_claim(
    api: httpx.AsyncClient, store: Store, clock: FakeClock
) -> None:
    """A begun attempt handed back uncounted (a result the daemon could not deliver)
    leaves no mark: its next claim counts the same attempt number again, and that one,
    never begun, is not charged when its lease runs out."""
    created = await submit(api, "again", max_attempts=3)
    first = await hello(api, "again", prefetch=1)
    [got] = await claim(api, first)
    await api.post(f"{W}/{first}/heartbeat", json={"running": [got["id"]], "prefetched": []})
    clock.advance(worker_service.LEASE_S + 1)
    beat = await api.post(f"{W}/{first}/heartbeat", json={"running": [], "prefetched": []})
    assert beat.json()["released"] == 1
    second = await hello(api, "again", prefetch=1)
    [again] = await claim(api, second)
    assert again["attempts"] == 1
    clock.advance(worker_service.LEASE_S + 1)
    assert (await reaper.reap(store, clock()))["retried"] == 0
    assert (await invocation(api, created["id"]))["attempts"] == 0
