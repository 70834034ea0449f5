"""The controller when things go wrong: hung providers and scalers, records it cannot read,
launched daemons that vanish, leadership of pinned queues (both stores)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from sqlalchemy import update

from lakeshore.config import Settings
from lakeshore.services.fleet.controller import Controller
from lakeshore.services.taskqueue import reaper
from lakeshore.store.engine import Store
from lakeshore.store.tables import queues
from tests.conftest import FakeClock
from tests.integration.test_api_workers import W, hello
from tests.integration.test_controller import NS, elastic, provider, queue, submit_many, tick


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"elasticity_call_timeout_s": 0.2})


async def events(api: httpx.AsyncClient, queue_name: str) -> list[dict[str, Any]]:
    response = await api.get(f"{NS}/queues/{queue_name}/events", params={"verbose": "true"})
    assert response.status_code == 200, response.text
    return list(response.json()["events"])


async def test_a_hung_launch_fails_frees_its_slot_and_revokes_its_token(
    api: httpx.AsyncClient, launch_tokens: list[str]
) -> None:
    tokens = launch_tokens
    await provider(api, hang_s=30)
    await queue(api, "hung", elastic(max=1), providerRef="fk")
    await submit_many(api, "hung", 1)
    decision = (await tick(api))["hung"]
    assert decision["action"] == "tick_noop"
    assert decision["reason"] == (
        "target 1 > daemons 0 + in flight 0 → launch; "
        'launch failed: provider "fk" did not answer within 0.2 s'
    )
    [launch] = (await api.get(f"{NS}/providers/fk/launches")).json()["launches"]
    assert (launch["id"], launch["state"]) == (decision["launch_id"], "failed")
    assert (await tick(api))["hung"]["before"]["in_flight"] == 0  # so it launches again
    token = tokens[0]
    joined = await api.post(
        f"{W}/hello", json={"queues": ["hung"]}, headers={"Authorization": f"Bearer {token}"}
    )
    assert joined.status_code == 401


async def test_a_slow_launch_outlives_its_tick_without_a_double_launch(
    api: httpx.AsyncClient, store: Store, clock: FakeClock
) -> None:
    """A tick waits for provider calls only within its budget; the next tick sees the
    slow launch in flight, and the slow launch writes its own audit row when it ends."""
    await provider(api, hang_s=30)
    await queue(api, "slow", elastic(max=1), providerRef="fk")
    await submit_many(api, "slow", 3)
    controller = Controller(store, clock=clock, server_url="http://x", call_timeout_s=0.5)
    try:
        first = await controller.tick(budget_s=0.0)
        assert "slow" not in {d["scope"] for d in first}  # still launching
        [second] = [d for d in await controller.tick(budget_s=0.0) if d["scope"] == "slow"]
        assert second["action"] == "tick_noop"
        assert second["before"]["in_flight"] == 1
        assert second["reason"] == "at max (1): pending 3 → target 1, daemons 0 + in flight 1"
        for _ in range(100):  # the slow launch times out (0.5 s) and writes its row
            if len(await events(api, "slow")) == 2:
                break
            await asyncio.sleep(0.05)
        feed = await events(api, "slow")
        assert [e["action"] for e in feed] == ["tick_noop", "tick_noop"]
        late = next(e for e in feed if "launch failed" in e["reason"])
        assert late["reason"].endswith('provider "fk" did not answer within 0.5 s')
        launches = (await api.get(f"{NS}/providers/fk/launches")).json()["launches"]
        assert [launch["state"] for launch in launches] == ["failed"]
    finally:
        await controller.close()


async def test_a_hung_scaler_is_not_called_again_while_it_runs(api: httpx.AsyncClient) -> None:
    """A scaler that timed out keeps its thread until it returns: the next tick does not
    call it again (one hung scaler holds one thread, not one more each tick)."""
    await queue(api, "stuck", elastic(max=5), customScalerUdf="tests.udfs:scaler_hangs")
    first = (await tick(api))["stuck"]
    assert "did not answer within 0.2 s" in first["reason"]
    second = (await tick(api))["stuck"]
    assert second["action"] == "tick_noop"
    assert "still running from an earlier tick" in second["reason"]


async def test_a_stored_kind_this_server_does_not_know_is_a_noop_not_a_broken_tick(
    api: httpx.AsyncClient, store: Store
) -> None:
    """A record written by a newer server (or straight into the store) with a kind this
    server does not know: that queue gets the spec's no-op, every other queue still ticks,
    and reads show the stored kind."""
    await queue(api, "future", elastic())
    await queue(api, "today", elastic())
    await submit_many(api, "today", 1)
    async with store.write() as conn:
        await conn.execute(
            update(queues)
            .where(queues.c.name == "future")
            .values(elasticity={"kind": "turbo", "min": 0, "max": 3})
        )
    decisions = await tick(api)
    assert decisions["future"]["action"] == "tick_noop"
    assert decisions["future"]["reason"] == (
        'unknown elasticity.kind="turbo" — defaulting to no-op'
    )
    assert decisions["today"]["rule"].startswith("fully_elastic")
    shown = await api.get(f"{NS}/queues/future")
    assert shown.status_code == 200, shown.text
    assert shown.json()["elasticity"] == {"kind": "turbo", "min": 0, "max": 3}
    listed = await api.get(f"{NS}/queues")
    assert listed.status_code == 200
    assert (await api.get(f"{NS}/queues/future/stats")).status_code == 200


async def test_a_lost_launched_daemon_is_stopped_and_its_token_revoked(
    api: httpx.AsyncClient, store: Store, clock: FakeClock, launch_tokens: list[str]
) -> None:
    """A launched daemon silent past the worker TTL is dropped; the next tick asks its
    provider to stop its instance, and the token its instance holds opens nothing."""
    tokens = launch_tokens
    await provider(api)
    await queue(api, "lost", elastic(max=1), providerRef="fk")
    await submit_many(api, "lost", 1)
    launch_id = (await tick(api))["lost"]["launch_id"]
    [token] = tokens
    own = {"Authorization": f"Bearer {token}"}
    joined = await api.post(
        f"{W}/hello", json={"queues": ["lost"], "launch_id": launch_id}, headers=own
    )
    assert joined.status_code == 200, joined.text
    clock.advance(reaper.WORKER_TTL_S + 1)
    swept = await reaper.reap(store, clock())
    assert swept["workers_dropped"] == 1
    await tick(api)
    [launch] = [
        launch
        for launch in (await api.get(f"{NS}/providers/fk/launches")).json()["launches"]
        if launch["id"] == launch_id
    ]
    assert launch["state"] == "succeeded"
    assert launch["terminated_at"] is not None and launch["terminate_error"] is None
    again = await api.post(f"{W}/hello", json={"queues": ["lost"]}, headers=own)
    assert again.status_code == 401
    await tick(api)  # stopped once: a later tick does not pick it again
    [still] = [
        launch
        for launch in (await api.get(f"{NS}/providers/fk/launches")).json()["launches"]
        if launch["id"] == launch_id
    ]
    assert still["terminated_at"] == launch["terminated_at"]


async def test_a_retired_daemons_launch_is_not_stopped_twice(
    api: httpx.AsyncClient, store: Store, clock: FakeClock
) -> None:
    """A daemon the controller retired has its launch terminated once, by the retirement."""
    await provider(api)
    await queue(api, "done", elastic(max=1), providerRef="fk")
    await submit_many(api, "done", 1)
    launch_id = (await tick(api))["done"]["launch_id"]
    worker = await hello(api, ["done"], launch_id=launch_id)
    await api.patch(f"{NS}/queues/done", json={"elasticity": elastic(max=0)})
    killed = (await tick(api))["done"]
    assert (killed["action"], killed["victim"]) == ("scale_down", worker)
    launches = (await api.get(f"{NS}/providers/fk/launches")).json()["launches"]
    stopped = next(launch for launch in launches if launch["id"] == launch_id)["terminated_at"]
    clock.advance(5)
    await tick(api)
    launches = (await api.get(f"{NS}/providers/fk/launches")).json()["launches"]
    assert next(launch for launch in launches if launch["id"] == launch_id)["terminated_at"] == (
        stopped
    )
