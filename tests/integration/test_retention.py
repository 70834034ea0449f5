"""Retention through the API, on both stores: finished invocations past their window go
with their stream items (pending and running ones never), a queue's own ``retention_s``
wins over the server's, a key is free again once its invocation is gone, decision events
go by their last tick, deletions are counted in ``/metrics``, and batches are bounded."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import bindparam, func, insert, select, text

from lakeshore.api.app import create_app
from lakeshore.api.deps import AppState
from lakeshore.config import Settings
from lakeshore.domain.retention import Deleted
from lakeshore.services.taskqueue import retention
from lakeshore.store import retention as retention_store
from lakeshore.store.leadership import Always, Duty
from lakeshore.store.tables import elasticity_events, invocations, namespaces, stream_items
from tests.conftest import ADMIN, FakeClock
from tests.integration.test_api_workers import claim, hello, submit

NS = "/v1/namespaces/default"
W = "/v1/workers"
HOUR = 3600.0
WINDOWS = retention.Windows(retention_s=HOUR, event_retention_s=HOUR, noop_retention_s=HOUR)

Served = tuple[httpx.AsyncClient, AppState]


@pytest.fixture
async def served(settings: Settings, clock: FakeClock) -> AsyncIterator[Served]:
    """The API and its state: the sweep run by hand with the app's store and metrics."""
    app = create_app(settings, clock=clock)
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://t", headers=ADMIN
        ) as client:
            yield client, app.state.lakeshore


async def queue(api: httpx.AsyncClient, name: str, **fields: Any) -> None:
    made = await api.post(f"{NS}/queues", json={"name": name, **fields})
    assert made.status_code == 201, made.text


async def sweep(state: AppState, clock: FakeClock, **bounds: int) -> Deleted:
    return await retention.sweep(state.store, clock(), WINDOWS, state.metrics, **bounds)


async def exists(api: httpx.AsyncClient, invocation_id: str) -> bool:
    got = await api.get(f"{NS}/invocations/{invocation_id}")
    assert got.status_code in (200, 404), got.text
    return got.status_code == 200


async def cancelled(api: httpx.AsyncClient, q: str, **body: Any) -> str:
    made = await submit(api, q, **body)
    done = await api.post(f"{NS}/invocations/{made['id']}/cancel")
    assert done.status_code == 200, done.text
    return str(made["id"])


async def test_finished_invocations_past_the_window_go_with_their_stream_items(
    served: Served, clock: FakeClock
) -> None:
    api, state = served
    await queue(api, "r")
    worker = await hello(api, ["r"], capacity=8)
    ids = [(await submit(api, "r"))["id"] for _ in range(3)]
    claimed = {c["id"] for c in await claim(api, worker, max=3)}
    assert claimed == set(ids)
    ok, failed, running = ids
    posted = await api.post(
        f"{W}/{worker}/invocations/{ok}/stream", json={"seq": 0, "items": [1, 2, 3]}
    )
    assert posted.status_code == 200, posted.text
    done = await api.post(f"{W}/{worker}/invocations/{ok}/complete", json={"result": 1})
    assert done.status_code == 200, done.text
    fail = {"error": {"type": "E", "message": "no"}, "retry": False}
    assert (await api.post(f"{W}/{worker}/invocations/{failed}/fail", json=fail)).is_success
    gone_cancelled = await cancelled(api, "r")
    clock.advance(HOUR - 1)
    assert (await sweep(state, clock)).invocations == 0  # not yet past the window
    pending = (await submit(api, "r"))["id"]
    clock.advance(2)

    deleted = await sweep(state, clock)

    assert deleted.as_counts() == {"invocations": 3, "stream_items": 3, "events": 0}
    for invocation_id in (ok, failed, gone_cancelled):
        assert not await exists(api, invocation_id)
    assert await exists(api, running) and await exists(api, pending)
    async with state.store.read() as conn:
        items = await conn.execute(select(func.count()).select_from(stream_items))
        assert items.scalar_one() == 0
    stats = (await api.get(f"{NS}/queues/r/stats")).json()
    assert (stats["pending"], stats["running"]) == (1, 1)


async def test_a_queues_own_retention_s_wins_over_the_servers_and_can_be_patched(
    served: Served, clock: FakeClock
) -> None:
    api, state = served
    await queue(api, "short", retention_s=60)
    await queue(api, "default")
    await queue(api, "long", retention_s=2 * HOUR)
    shown = (await api.get(f"{NS}/queues/short")).json()
    assert shown["retention_s"] == 60
    short, default, long = [await cancelled(api, q) for q in ("short", "default", "long")]
    clock.advance(61)

    assert (await sweep(state, clock)).invocations == 1
    assert not await exists(api, short)
    assert await exists(api, default) and await exists(api, long)

    clock.advance(HOUR)
    assert (await sweep(state, clock)).invocations == 1
    assert not await exists(api, default) and await exists(api, long)

    patched = await api.patch(f"{NS}/queues/long", json={"retention_s": 600})
    assert patched.status_code == 200, patched.text
    assert (await sweep(state, clock)).invocations == 1
    assert not await exists(api, long)


@pytest.mark.parametrize("bad", [0, -5, "1h", True, 10**12])
async def test_a_bad_retention_s_is_refused_with_a_422_naming_it(
    served: Served, bad: object
) -> None:
    api, _ = served
    made = await api.post(f"{NS}/queues", json={"name": "bad", "retention_s": bad})

    assert made.status_code == 422, made.text
    assert "retention_s" in made.text


async def test_a_key_returns_the_earlier_invocation_within_the_window_and_is_free_after(
    served: Served, clock: FakeClock
) -> None:
    api, state = served
    await queue(api, "k")
    first = await cancelled(api, "k", key="nightly-2026-01-01")
    again = await api.post(
        f"{NS}/queues/k/invocations", json={"fn": "m:f", "key": "nightly-2026-01-01"}
    )
    assert again.json()["id"] == first  # within the window: the earlier one
    clock.advance(HOUR + 1)
    assert (await sweep(state, clock)).invocations == 1

    fresh = await api.post(
        f"{NS}/queues/k/invocations", json={"fn": "m:f", "key": "nightly-2026-01-01"}
    )

    assert fresh.status_code == 201, fresh.text
    assert fresh.json()["id"] != first
    assert fresh.json()["state"] == "pending"


async def test_decision_events_go_by_their_last_tick_and_no_ops_by_their_own_window(
    served: Served, clock: FakeClock
) -> None:
    _, state = served
    start = clock()
    async with state.store.write() as conn:
        ns_id = (
            await conn.execute(select(namespaces.c.id).where(namespaces.c.name == "default"))
        ).scalar_one()
        row = {"namespace_id": ns_id, "queue_name": "q", "reason": "r", "before": {}, "after": {}}
        for event in [
            {**row, "action": "scale_up", "created_at": start},
            {**row, "action": "tick_noop", "created_at": start},  # never folded
            # folded until 50 min later: it counts from then
            {
                **row,
                "action": "tick_noop",
                "created_at": start,
                "repeats": 9,
                "last_at": start + timedelta(minutes=50),
            },
            {**row, "action": "scale_down", "created_at": start + timedelta(minutes=30)},
        ]:
            await conn.execute(
                insert(elasticity_events).values({"repeats": 1, "last_at": None, **event})
            )
    clock.advance(HOUR + 1)

    assert (await sweep(state, clock)).events == 2

    async with state.store.read() as conn:
        left = await conn.execute(
            select(elasticity_events.c.action, elasticity_events.c.repeats).order_by(
                elasticity_events.c.id
            )
        )
        assert left.all() == [("tick_noop", 9), ("scale_down", 1)]
    shorter = retention.Windows(event_retention_s=HOUR, noop_retention_s=60)
    assert (await retention.sweep(state.store, clock(), shorter)).events == 1  # the folded no-op


async def test_deletions_are_counted_in_the_metrics_by_kind(
    served: Served, clock: FakeClock
) -> None:
    api, state = served
    await queue(api, "m")
    for _ in range(2):
        await cancelled(api, "m")
    clock.advance(HOUR + 1)
    await sweep(state, clock)

    exposition = (await api.get("/metrics")).text
    found = {
        sample.labels["kind"]: sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
        if sample.name == "lakeshore_retention_deleted_total"
    }
    assert found == {"invocations": 2, "stream_items": 0, "events": 0}


async def test_a_sweep_deletes_in_bounded_batches_and_the_next_sweep_goes_on(
    served: Served, clock: FakeClock
) -> None:
    api, state = served
    await queue(api, "b")
    ids = [await cancelled(api, "b") for _ in range(5)]
    clock.advance(HOUR + 1)

    first = await sweep(state, clock, batch_rows=2, max_batches=2)
    second = await sweep(state, clock, batch_rows=2, max_batches=2)

    assert (first.invocations, second.invocations) == (4, 1)
    assert [await exists(api, i) for i in ids] == [False] * 5


async def test_the_sweep_reads_finished_rows_through_their_partial_index(
    served: Served, clock: FakeClock
) -> None:
    """PostgreSQL would scan a table this small whole: told not to, it must find the
    partial index usable, its condition implied by the sweep's."""
    _, state = served
    query = retention_store.finished_batch("q_1", clock(), 1000)
    async with state.store.write() as conn:
        compiled = query.compile(conn.sync_connection, compile_kwargs={"literal_binds": True})
        if conn.dialect.name == "postgresql":  # the batch's own statement there
            await conn.execute(text("SET LOCAL enable_seqscan = off"))
            explain = text(f"EXPLAIN {retention_store.DELETE_FINISHED_PG.text}").bindparams(
                bindparam("before", type_=invocations.c.finished_at.type)
            )
            params = {"queue_id": "q_1", "before": clock(), "limit": 1000}
            plan = (await conn.execute(explain, params)).scalars().all()
        else:
            rows = (await conn.execute(text(f"EXPLAIN QUERY PLAN {compiled}"))).all()
            plan = [str(row[-1]) for row in rows]

    assert any("ix_invocations_finished" in line for line in plan), plan


class Following:
    """A replica that does not do the cluster's housekeeping (another holds its lock)."""

    leading = False

    async def try_lead(self) -> bool:
        return False

    async def release(self) -> None:
        return None


@pytest.mark.parametrize(("duty", "kept"), [(Following(), True), (Always(), False)])
async def test_the_loop_sweeps_only_where_the_server_does_the_housekeeping(
    served: Served, clock: FakeClock, duty: Duty, kept: bool
) -> None:
    api, state = served
    await queue(api, "led")
    invocation = await cancelled(api, "led")
    clock.advance(HOUR + 1)
    sleeps: list[float] = []

    async def three_sweeps(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) > 3:
            raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await retention.run_forever(
            state.store, duty, clock, 60.0, WINDOWS, state.metrics, sleep=three_sweeps
        )

    assert sleeps == [60.0] * 4
    assert await exists(api, invocation) is kept


async def test_a_sweep_that_deleted_vacuums_where_postgresql_does_not(
    served: Served, clock: FakeClock
) -> None:
    """With ``autovacuum`` off a deleted row's room is never reused: the sweep vacuums."""
    api, state = served
    if state.store.dialect != "postgresql":
        pytest.skip("SQLite reuses a deleted row's pages by itself")
    async with state.store.read() as conn:
        if await retention_store.vacuumed_by_the_server(conn):
            pytest.skip("this PostgreSQL runs autovacuum: the sweep leaves it to it")
    last_vacuum = text("SELECT last_vacuum FROM pg_stat_user_tables WHERE relname = 'invocations'")
    await queue(api, "v", retention_s=60)
    await cancelled(api, "v")
    clock.advance(3600)
    assert (await sweep(state, clock)).invocations == 1
    async with state.store.read() as conn:
        assert (await conn.execute(last_vacuum)).scalar_one() is not None
