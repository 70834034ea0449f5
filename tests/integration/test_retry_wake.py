"""A waiting claim takes a retry when its backoff ends, not at its next re-check (issue
36, item 11): a failed attempt goes back to pending with ``available_at`` one backoff
ahead (1 s after a first attempt); the failure wakes the queue's waiting claims, and a
claim that finds only work not yet due waits until the earliest of it falls due."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import httpx
import pytest
from asgi_lifespan import LifespanManager

from lakeshore.api.app import create_app
from lakeshore.api.deps import AppState
from lakeshore.config import Settings
from lakeshore.services.taskqueue import reaper
from lakeshore.services.taskqueue import workers as worker_service
from tests.conftest import ADMIN, FakeClock
from tests.integration.test_api_crashes import hello as crash_hello
from tests.integration.test_api_workers import claim, hello, submit

W = "/v1/workers"
NS = "/v1/namespaces/default"
WINDOW_S = 20  # a claim's longest wait; the backoff is 1 s
ERROR = {"type": "RuntimeError", "message": "the child died"}


@pytest.fixture
async def real_time_api(settings: Settings) -> AsyncIterator[tuple[httpx.AsyncClient, AppState]]:
    """The API on the wall clock, its claims re-checking only every 60 s: a claim that
    ends with work well before its 20 s was woken, or timed its wait to the work's due
    time (without either, it took the retry only in its last look, at 20 s)."""
    app = create_app(settings.model_copy(update={"claim_recheck_s": 60.0}))
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://lakeshore.test", headers=ADMIN, timeout=40
        ) as client:
            yield client, app.state.lakeshore


async def until_waiting(state: AppState, count: int = 1) -> None:
    """Until ``count`` claims wait on the server's notifier. A claim registers its wait
    before it looks for work, so whatever is notified from then on wakes it, even in the
    middle of its look."""
    for _ in range(1000):
        if state.notifier.waiting() >= count:
            return
        await asyncio.sleep(0.01)
    pytest.fail("the claim never waited")


@pytest.mark.parametrize("batched", [False, True])
async def test_a_waiting_claim_takes_a_retry_when_its_backoff_ends(
    real_time_api: tuple[httpx.AsyncClient, AppState], batched: bool
) -> None:
    api, state = real_time_api
    created = await submit(api, "q", max_attempts=2)
    worker = await hello(api, ["q"], capacity=2)
    [got] = await claim(api, worker)
    # the worker's other slot waits for work (the daemon's long-poll) ...
    asked = time.monotonic()
    body = {"timeout_s": WINDOW_S}
    waiting = asyncio.create_task(api.post(f"{W}/{worker}/claim", json=body))
    await until_waiting(state)
    # ... as the running attempt fails, retryable (alone, or in a batch of outcomes)
    if batched:
        body = {"results": [{"id": got["id"], "error": ERROR, "retry": True}], "claim": 0}
        failed = await api.post(f"{W}/{worker}/results", json=body)
        assert failed.json()["results"] == [{"id": got["id"], "state": "pending"}]
    else:
        failed = await api.post(f"{W}/{worker}/invocations/{got['id']}/fail", json={"error": ERROR})
        assert failed.json()["state"] == "pending"
    answer = await waiting
    assert answer.status_code == 200, answer.text
    [again] = answer.json()["invocations"]
    assert (again["id"], again["attempts"]) == (created["id"], 2)
    assert time.monotonic() - asked < WINDOW_S / 2  # not in the claim's last look


async def test_a_claim_made_during_the_backoff_waits_for_its_end(
    real_time_api: tuple[httpx.AsyncClient, AppState],
) -> None:
    api, _ = real_time_api
    created = await submit(api, "q", max_attempts=2)
    worker = await hello(api, ["q"], capacity=1)
    [got] = await claim(api, worker)
    failed = await api.post(f"{W}/{worker}/invocations/{got['id']}/fail", json={"error": ERROR})
    assert failed.json()["state"] == "pending"
    assert await claim(api, worker) == []  # backing off
    asked = time.monotonic()
    answer = await api.post(f"{W}/{worker}/claim", json={"timeout_s": WINDOW_S})
    [again] = answer.json()["invocations"]
    assert (again["id"], again["attempts"]) == (created["id"], 2)
    assert time.monotonic() - asked < WINDOW_S / 2  # not in the claim's last look


@pytest.fixture
async def recheck_never(
    settings: Settings, clock: FakeClock
) -> AsyncIterator[tuple[httpx.AsyncClient, AppState]]:
    """The API on the test's clock, its claims re-checking only every 60 s and no reaper
    of its own: the test sweeps, with the server's notifier."""
    update = {"claim_recheck_s": 60.0, "reaper_interval_s": 0}
    app = create_app(settings.model_copy(update=update), clock=clock)
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://lakeshore.test", headers=ADMIN, timeout=40
        ) as client:
            yield client, app.state.lakeshore


async def test_work_the_reaper_hands_back_unbegun_wakes_a_waiting_claim(
    recheck_never: tuple[httpx.AsyncClient, AppState], clock: FakeClock
) -> None:
    """A prefetching worker's lease that runs out unbegun goes back at once, uncounted;
    the sweep wakes the queue's waiting claims, which take it then, not at their next
    re-check (60 s here) or at the end of their wait (20 s)."""
    api, state = recheck_never
    created = await submit(api, "swept")
    gone = await crash_hello(api, "swept", prefetch=4)
    [held] = await claim(api, gone)
    assert held["id"] == created["id"]
    clock.advance(worker_service.LEASE_S + 1)
    rescuer = await hello(api, ["swept"], capacity=1)
    asked = time.monotonic()
    waiting = asyncio.create_task(api.post(f"{W}/{rescuer}/claim", json={"timeout_s": WINDOW_S}))
    await until_waiting(state)
    swept = await reaper.reap(state.store, clock(), notifier=state.notifier)
    assert (swept["returned"], swept["retried"]) == (1, 0)
    answer = await waiting
    assert answer.status_code == 200, answer.text
    [again] = answer.json()["invocations"]
    assert (again["id"], again["attempts"]) == (created["id"], 1)  # the first, uncharged
    assert time.monotonic() - asked < WINDOW_S / 2  # woken, not its wait's last look
