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
from lakeshore.config import Settings
from tests.conftest import ADMIN
from tests.integration.test_api_workers import claim, hello, submit

W = "/v1/workers"
NS = "/v1/namespaces/default"
WINDOW_S = 20  # a claim's longest wait; the backoff is 1 s
ERROR = {"type": "RuntimeError", "message": "the child died"}


@pytest.fixture
async def real_time_api(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """The API on the wall clock, its claims re-checking only every 60 s: a claim that
    ends with work well before its 20 s was woken, or timed its wait to the work's due
    time (without either, it took the retry only in its last look, at 20 s)."""
    app = create_app(settings.model_copy(update={"claim_recheck_s": 60.0}))
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://lakeshore.test", headers=ADMIN, timeout=40
        ) as client:
            yield client


async def _last_seen(api: httpx.AsyncClient) -> str:
    """When the (one) worker was last heard from: each look of a claim moves it."""
    [daemon] = (await api.get(f"{NS}/daemons")).json()["daemons"]
    return str(daemon["lastSeenAt"])


async def _seen_after(api: httpx.AsyncClient, seen: str) -> str:
    for _ in range(500):
        if (now := await _last_seen(api)) != seen:
            return now
        await asyncio.sleep(0.01)
    pytest.fail("the waiting claim did not look")


@pytest.mark.parametrize("batched", [False, True])
async def test_a_waiting_claim_takes_a_retry_when_its_backoff_ends(
    real_time_api: httpx.AsyncClient, batched: bool
) -> None:
    api = real_time_api
    created = await submit(api, "q", max_attempts=2)
    worker = await hello(api, ["q"], capacity=2)
    [got] = await claim(api, worker)
    # the worker's other slot waits for work (the daemon's long-poll) ...
    seen = await _last_seen(api)
    asked = time.monotonic()
    body = {"timeout_s": WINDOW_S}
    waiting = asyncio.create_task(api.post(f"{W}/{worker}/claim", json=body))
    for _ in range(2):  # its first look, then the look of its wait: it waits
        seen = await _seen_after(api, seen)
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
    real_time_api: httpx.AsyncClient,
) -> None:
    api = real_time_api
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
