"""A tick that launches for many queues writes their launch handles together: every
launch has its handle stored before the tick answers, in far fewer statements than
launches (group commit), on both stores."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from lakeshore.store import launches as launch_store
from tests.conftest import FakeClock
from tests.integration.test_controller import NS, elastic, provider, queue, submit_many, tick

QUEUES = 40


def batch_sizes(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """The rows of each call of ``launch_store.<name>`` (a write of many rows at once)."""
    sizes: list[int] = []
    real = getattr(launch_store, name)

    async def counted(conn: Any, rows: Any) -> None:
        sizes.append(len(rows))
        await real(conn, rows)

    monkeypatch.setattr(launch_store, name, counted)
    return sizes


async def test_a_tick_of_many_launches_commits_their_handles_together(
    api: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes = batch_sizes(monkeypatch, "started_many")
    await provider(api)
    for n in range(QUEUES):
        await queue(api, f"q{n}", elastic(max=1), providerRef="fk")
        await submit_many(api, f"q{n}", 1)
    decisions = await tick(api)
    launched = {d["launch_id"] for d in decisions.values() if d["action"] == "scale_up"}
    assert len(launched) == QUEUES
    assert sum(writes) == QUEUES and len(writes) < QUEUES / 4, writes
    page = (await api.get(f"{NS}/providers/fk/launches", params={"limit": 100})).json()
    stored = {x["id"]: x["handle"] for x in page["launches"]}
    assert set(stored) == launched
    assert all(stored[i] == {"fake": i} for i in launched)  # each launch its own handle


async def test_a_tick_that_expires_many_launches_records_their_stops_together(
    api: httpx.AsyncClient, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launches of one tick never say hello: past their TTL, the next tick stops each
    through its provider and records every stop, in a few statements."""
    writes = batch_sizes(monkeypatch, "terminated_many")
    await provider(api)
    for n in range(QUEUES):
        await queue(api, f"q{n}", elastic(max=1), providerRef="fk")
        await submit_many(api, f"q{n}", 1)
    launched = {d["launch_id"] for d in (await tick(api)).values() if d.get("launch_id")}
    assert len(launched) == QUEUES
    clock.advance(60)  # past the fake provider's TTL
    await tick(api)
    assert sum(writes) == QUEUES and len(writes) < QUEUES / 4, writes
    page = (await api.get(f"{NS}/providers/fk/launches", params={"limit": 100})).json()
    stopped = {x["id"] for x in page["launches"] if x["terminated_at"] is not None}
    assert launched <= stopped
