"""One namespace cannot stop lease recovery for the others: the server's own reaper loop
returns another namespace's expired lease while a queue holds a deadline cutoff the date
arithmetic cannot hold (stored before cutoffs were bounded; the API now refuses it), and
each step of a sweep fails alone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
from asgi_lifespan import LifespanManager
from sqlalchemy import update

from lakeshore.api.app import create_app
from lakeshore.config import Settings
from lakeshore.services.taskqueue import reaper
from lakeshore.store.engine import Store
from lakeshore.store.tables import queues
from tests.conftest import ADMIN, FakeClock

LEASE_S = 5.0


@pytest.fixture
async def reaping_api(settings: Settings, clock: FakeClock) -> AsyncIterator[httpx.AsyncClient]:
    """The API in-process with its reaper loop running (every 20 ms, on the fake clock)."""
    app = create_app(
        settings.model_copy(update={"reaper_interval_s": 0.02, "lease_s": LEASE_S}), clock=clock
    )
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://lakeshore.test", headers=ADMIN
        ) as client:
            yield client


async def _poisoned_queue(api: httpx.AsyncClient, store: Store) -> None:
    """Namespace "a" holds a queue whose cutoff is 1e11 s (3,000 years before now)."""
    assert (await api.post("/v1/namespaces", json={"name": "a"})).status_code == 201
    made = await api.post(
        "/v1/namespaces/a/queues",
        json={"name": "poisoned", "admission": {"deadline_cutoff_s": 60}},
    )
    assert made.status_code == 201, made.text
    async with store.write() as conn:  # as a version without the bound stored it
        await conn.execute(
            update(queues)
            .where(queues.c.name == "poisoned")
            .values(admission={"deadline_cutoff_s": 1e11})
        )
    sub = await api.post("/v1/namespaces/a/queues/poisoned/invocations", json={"fn": "m:f"})
    assert sub.status_code == 201, sub.text


async def _held_then_silent(api: httpx.AsyncClient) -> str:
    """Namespace "b"'s worker claims an invocation, then stops heartbeating."""
    assert (await api.post("/v1/namespaces", json={"name": "b"})).status_code == 201
    sub = await api.post("/v1/namespaces/b/queues/work/invocations", json={"fn": "m:f"})
    assert sub.status_code == 201, sub.text
    hello = await api.post("/v1/workers/hello", json={"namespace": "b", "queues": ["work"]})
    worker = hello.json()["id"]
    claimed = await api.post(f"/v1/workers/{worker}/claim", json={"timeout_s": 0})
    assert [i["id"] for i in claimed.json()["invocations"]] == [sub.json()["id"]]
    return str(sub.json()["id"])


async def test_another_namespaces_overflowing_cutoff_does_not_stop_lease_recovery(
    reaping_api: httpx.AsyncClient, store: Store, clock: FakeClock
) -> None:
    await _poisoned_queue(reaping_api, store)
    held = await _held_then_silent(reaping_api)
    clock.advance(LEASE_S + 1)
    state = ""
    for _ in range(250):  # the loop sweeps every 20 ms; 5 s at most
        state = (await reaping_api.get(f"/v1/namespaces/b/invocations/{held}")).json()["state"]
        if state == "pending":
            break
        await asyncio.sleep(0.02)
    assert state == "pending"


async def test_each_step_of_a_sweep_runs_when_the_deadline_step_has_a_bad_queue(
    reaping_api: httpx.AsyncClient, store: Store, clock: FakeClock
) -> None:
    await _poisoned_queue(reaping_api, store)
    await _held_then_silent(reaping_api)
    made = await reaping_api.post(
        "/v1/namespaces/b/queues", json={"name": "dated", "admission": {"deadline_cutoff_s": 10}}
    )
    assert made.status_code == 201, made.text
    late = await reaping_api.post("/v1/namespaces/b/queues/dated/invocations", json={"fn": "m:f"})
    clock.advance(reaper.WORKER_TTL_S + 1)
    swept = await reaper.reap(store, clock())  # the loop may have swept part of it already
    answer = (await reaping_api.get(f"/v1/namespaces/b/invocations/{late.json()['id']}")).json()
    assert answer["state"] == "expired"  # the good queue's deadline still applies
    assert (await reaping_api.get("/v1/namespaces/b/daemons")).json()["daemons"] == []
    assert set(swept) == {"retried", "failed", "returned", "expired", "workers_dropped"}
