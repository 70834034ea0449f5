"""Scale from zero without waiting for the tick: with the controller's loop running, a
submit to a queue the last tick left at zero (no daemon, nothing in flight, nothing
pending, a target policy) has its scope planned at once — one extra decision, one launch
at most — while a hysteresis policy waits for its tick (both stores)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager

from lakeshore.api.app import create_app
from lakeshore.config import Settings
from lakeshore.services.fleet import elasticity_loop
from tests.conftest import ADMIN, FakeClock
from tests.integration.test_controller import NS, TICK, elastic, provider, queue, submit_many

LONG_S = 3600.0  # the loop's interval: no second tick during a test


@pytest.fixture
async def looping(
    settings: Settings, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    """The API with the controller's loop on (one tick at start, the next in an hour),
    once that first tick is over and the loop waits between ticks."""
    waiting = asyncio.Event()
    serve_until = elasticity_loop._Nudges.serve_until

    async def between_ticks(self: Any, *args: Any) -> None:
        waiting.set()
        await serve_until(self, *args)

    monkeypatch.setattr(elasticity_loop._Nudges, "serve_until", between_ticks)
    app = create_app(
        settings.model_copy(update={"elasticity_enabled": True, "elasticity_interval_s": LONG_S}),
        clock=clock,
    )
    async with LifespanManager(app) as manager:
        async with asyncio.timeout(30):
            await waiting.wait()
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://lakeshore.test", headers=ADMIN
        ) as client:
            yield app.state.lakeshore, client


async def _launches(api: httpx.AsyncClient) -> list[dict[str, Any]]:
    return list((await api.get(f"{NS}/providers/fk/launches")).json()["launches"])


async def _decisions(api: httpx.AsyncClient, name: str) -> list[dict[str, Any]]:
    answer = await api.get(f"{NS}/queues/{name}/events", params={"verbose": "true"})
    return list(answer.json()["events"])


async def test_a_first_submit_at_zero_launches_without_waiting_for_the_tick(
    looping: tuple[Any, httpx.AsyncClient],
) -> None:
    state, api = looping
    await provider(api)
    await queue(api, "cold", elastic(max=3), providerRef="fk")
    await queue(api, "hyst", {"kind": "pool_with_threshold", "max": 3}, providerRef="fk")
    assert (await api.post(TICK)).status_code == 200  # the tick that leaves them at zero
    assert {scope for _, scope in state.controller.at_zero.values()} == {"cold"}
    await submit_many(api, "cold", 2)
    await submit_many(api, "hyst", 2)
    for _ in range(200):  # bounded: at most 10 s
        if await _launches(api):
            break
        await asyncio.sleep(0.05)
    launches = await _launches(api)
    assert [launch["scope"] for launch in launches] == ["cold"]  # hysteresis: its tick
    decisions = await _decisions(api, "cold")
    assert [d["action"] for d in decisions] == ["scale_up", "tick_noop"]  # newest first:
    # the nudge, and the tick by hand (the loop's own ran before the queue existed)
    assert decisions[0]["reason"] == "target 2 > daemons 0 + in flight 0 → launch"
    assert state.controller.at_zero == {}  # nudged once until the next tick
    await submit_many(api, "cold", 1)  # no second nudge: the next tick plans it
    assert len(await _decisions(api, "hyst")) == 1
    assert len(await _launches(api)) == 1


async def test_a_first_submit_to_a_queue_created_since_the_tick_launches_without_waiting(
    looping: tuple[Any, httpx.AsyncClient],
) -> None:
    state, api = looping
    await provider(api)
    # created after the loop's first tick: no tick has seen them at zero
    await queue(api, "fresh", elastic(max=3), providerRef="fk")
    await queue(
        api, "fresh-wait", {"kind": "wait_target", "wait_s": 60, "max": 8}, providerRef="fk"
    )
    await queue(api, "fresh-hyst", {"kind": "pool_with_threshold", "max": 3}, providerRef="fk")
    await submit_many(api, "fresh", 2)
    await submit_many(api, "fresh-wait", 20)
    await submit_many(api, "fresh-hyst", 2)
    for _ in range(200):  # bounded: at most 10 s
        scopes = {launch["scope"] for launch in await _launches(api)}
        if scopes >= {"fresh", "fresh-wait"}:
            break
        await asyncio.sleep(0.05)
    launches = await _launches(api)
    scopes = [launch["scope"] for launch in launches]
    assert scopes.count("fresh") == 1  # one nudge: one launch (max_step 1)
    assert scopes.count("fresh-wait") > 1  # wait_target: its burst
    assert "fresh-hyst" not in scopes  # hysteresis: its tick
    assert [d["action"] for d in await _decisions(api, "fresh")] == ["scale_up"]
    await submit_many(api, "fresh", 1)  # looked up once until the next tick
    assert len(await _decisions(api, "fresh")) == 1
    fresh_id = (await api.get(f"{NS}/queues/fresh")).json()["id"]
    assert state.controller.known is not None and fresh_id in state.controller.known
