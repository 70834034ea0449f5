"""The claim's plan holds on stale statistics, and a claim never grants a lease that has
already run out (issue 36, item 4).

Statistics taken while ``invocations`` was near empty and held no pending row (a fresh
deployment, a restore, autovacuum behind: it is off on the test machine's PostgreSQL)
once made PostgreSQL lease the picked rows through a nested-loop semi join over every
pending row: a claim of 1,000 with 50,000 pending took 25 s, and its leases had run out
before it answered."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager
from sqlalchemy import text

from lakeshore.api.app import create_app
from lakeshore.config import Settings
from lakeshore.domain.queue import parse_spec
from lakeshore.store import invocations as inv_store
from lakeshore.store import namespaces as ns_store
from lakeshore.store import queues as queue_store
from lakeshore.store.engine import Store, create_engine_for, parse_url
from tests.conftest import ADMIN, ADMIN_TOKEN, BACKENDS
from tests.integration.test_api_workers import claim, hello, submit

NS = "/v1/namespaces/default"
PENDING = 50_000


@pytest.fixture(params=BACKENDS)
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database of this test's own, not migrated yet (its statistics its own too)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'lakeshore.db'}"
    url: str = request.getfixturevalue("fresh_pg_url")
    return url


@pytest.fixture
async def served(empty_url: str, tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, Store]]:
    """The API on the real clock with the shortest lease there is, and the store."""
    settings = Settings(
        database_url=empty_url,
        data_dir=tmp_path / "data",
        admin_token=ADMIN_TOKEN,
        reaper_interval_s=0,
        elasticity_enabled=False,
        lease_s=1.0,
    )
    app = create_app(settings)
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        store = Store(create_engine_for(parse_url(empty_url)))
        try:
            async with httpx.AsyncClient(
                transport=transport, base_url="http://lakeshore.test", headers=ADMIN
            ) as client:
                yield client, store
        finally:
            await store.close()


_FILL = {  # PENDING pending invocations of one queue, in one statement
    "postgresql": "SELECT 'bulk_' || n AS n FROM generate_series(1, :count) AS n",
    "sqlite": (
        "WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < :count) "
        "SELECT 'bulk_' || n AS n FROM s"
    ),
}


async def _fill(store: Store, queue_id: str, namespace_id: str, count: int) -> None:
    columns = (
        "id, namespace_id, queue_id, queue_name, fn, args, kwargs, priority, state,"
        " attempts, max_attempts, available_at, created_at"
    )
    sql = (
        f"INSERT INTO invocations ({columns}) SELECT n, :ns, :queue, 'q', 'm:f', '[]', '{{}}',"
        f" 0, 'pending', 0, 1, :at, :at FROM ({_FILL[store.dialect]}) AS numbers"
    )
    at = datetime.now(UTC) - timedelta(minutes=1)
    stamp: Any = at if store.dialect == "postgresql" else at.replace(tzinfo=None).isoformat(" ")
    async with store.write() as conn:
        params = {"ns": namespace_id, "queue": queue_id, "at": stamp, "count": count}
        await conn.execute(text(sql), params)


async def _claim_plan(store: Store, queue_id: str) -> str:
    """The plan of a fifo claim of 1,000 from ``queue_id``, as the store would run it."""
    pg = store.dialect == "postgresql"
    statement = inv_store._lease_statement("fifo", pg)
    now = datetime.now(UTC)
    params = {
        "b_queue_id": queue_id,
        "b_now": now,
        "b_limit": 1000,
        "b_worker_id": "w_plan",
        "b_lease_s": 1.0,
        "b_lease_expires_at": now,
    }
    async with store.write() as conn:
        compiled = statement.compile(conn.sync_connection)
        bound = compiled.construct_params(params)
        if pg:
            found = await conn.exec_driver_sql("EXPLAIN (COSTS OFF) " + str(compiled), bound)
            plan = "\n".join(str(row[0]) for row in found)
        else:
            values = tuple(bound[name] for name in compiled.positiontup or ())
            found = await conn.exec_driver_sql("EXPLAIN QUERY PLAN " + str(compiled), values)
            plan = "\n".join(str(row[-1]) for row in found)
        await conn.rollback()  # EXPLAIN alone runs nothing; the transaction ends unwritten
    return plan


async def test_a_claim_on_stale_statistics_uses_the_key_and_grants_live_leases(
    served: tuple[httpx.AsyncClient, Store],
) -> None:
    api, store = served
    # a near-empty table, analysed: five finished invocations, none pending
    worker = await hello(api, ["q"], capacity=1000)
    for _ in range(5):
        await submit(api, "q")
    for invocation in await claim(api, worker, max=5):
        done = f"/v1/workers/{worker}/invocations/{invocation['id']}/complete"
        assert (await api.post(done, json={"result": None})).status_code == 200
    async with store.write() as conn:
        await conn.execute(
            text("ANALYZE invocations" if store.dialect == "postgresql" else "ANALYZE")
        )
        queue_id, namespace_id = (
            await conn.execute(text("SELECT id, namespace_id FROM queues WHERE name = 'q'"))
        ).one()
    await _fill(store, queue_id, namespace_id, PENDING)

    plan = await _claim_plan(store, queue_id)
    if store.dialect == "postgresql":
        assert (
            "Index Scan using pk_invocations" in plan or "Index Scan on pk_invocations" in plan
        ), plan
        assert "Nested Loop" not in plan, plan
    else:
        assert plan.startswith(
            "SEARCH invocations USING COVERING INDEX sqlite_autoindex_invocations_1 (id=?)"
        ), plan

    claimed = await claim(api, worker, max=1000)
    answered = datetime.now(UTC)
    assert len(claimed) == 1000
    expiries = [datetime.fromisoformat(i["lease_expires_at"]) for i in claimed]
    assert min(expiries) > answered, "a lease had run out before its claim answered"
    async with store.read() as conn:
        running = (
            await conn.execute(text("SELECT count(*) FROM invocations WHERE state = 'running'"))
        ).scalar_one()
    assert running == 1000


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_a_lease_runs_from_the_update_not_from_when_the_claim_began(store: Store) -> None:
    """PostgreSQL: time the claim's transaction spent before its update (a slow pick, a
    busy database) is not taken off the lease."""
    api_now = datetime.now(UTC)
    async with store.write() as conn:
        namespace = "ns_1"
        await ns_store.insert_namespace(conn, id=namespace, name="n", now=api_now)
        await queue_store.insert_queue(
            conn, id="q_1", namespace_id=namespace, spec=parse_spec({"name": "q"}), now=api_now
        )
    await _fill(store, "q_1", namespace, 3)
    async with store.write() as conn:
        await conn.execute(text("SELECT pg_sleep(0.5)"))
        rows = await inv_store.claim(
            conn, queue_id="q_1", kind="fifo", worker_id="w_1", limit=3, now=api_now, lease_s=1.0
        )
    assert len(rows) == 3
    for row in rows:
        assert row["started_at"] == api_now
        assert row["lease_expires_at"] >= api_now + timedelta(seconds=1.5)


async def _keyed_plan(store: Store, queue_id: str) -> str:
    """The plan of a fifo claim of 100 in turns between keys, as the store would run it
    (on PostgreSQL, EXPLAIN ANALYZE: as it ran)."""
    pg = store.dialect == "postgresql"
    statement = inv_store._turns_statement("fifo", pg)
    now = datetime.now(UTC)
    params = {
        "b_queue_id": queue_id,
        "b_now": now,
        "b_limit": 100,
        "b_per_key": None,
        "b_worker_id": "w_plan",
        "b_lease_s": 1.0,
        "b_lease_expires_at": now,
    }
    async with store.write() as conn:
        compiled = statement.compile(conn.sync_connection)
        bound = compiled.construct_params(params)
        if pg:
            found = await conn.exec_driver_sql(
                "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + str(compiled), bound
            )
            plan = "\n".join(str(row[0]) for row in found)
        else:
            values = tuple(bound[name] for name in compiled.positiontup or ())
            found = await conn.exec_driver_sql("EXPLAIN QUERY PLAN " + str(compiled), values)
            plan = "\n".join(str(row[-1]) for row in found)
        await conn.rollback()
    return plan


async def test_a_claim_in_turns_reads_each_key_s_first_rows_by_index(store: Store) -> None:
    """A flood of one key and a trickle of another: the claim reads the keys and each
    key's first rows from ``ix_invocations_pending_key``, never every pending row."""
    now = datetime.now(UTC)
    async with store.write() as conn:
        await ns_store.insert_namespace(conn, id="ns_1", name="n", now=now)
        await queue_store.insert_queue(
            conn, id="q_1", namespace_id="ns_1", spec=parse_spec({"name": "q"}), now=now
        )
    await _fill(store, "q_1", "ns_1", PENDING)
    async with store.write() as conn:
        await conn.execute(text("UPDATE invocations SET concurrency_key = 'a'"))
        await conn.execute(
            text(
                "UPDATE invocations SET concurrency_key = 'b'"
                " WHERE id IN ('bulk_7', 'bulk_70', 'bulk_700')"
            )
        )
        await conn.execute(
            text("ANALYZE invocations" if store.dialect == "postgresql" else "ANALYZE")
        )

    plan = await _keyed_plan(store, "q_1")
    assert "ix_invocations_pending_key" in plan, plan
    if store.dialect == "postgresql":
        assert "Seq Scan on invocations" not in plan, plan
        # no step of the plan reads (or sorts) the flood: at most what the claim could take
        rows = [int(n) for n in re.findall(r"actual rows=(\d+)", plan)]
        assert max(rows) <= 100 + 3, plan
    else:  # every read of the table goes by an index
        scans = [line for line in plan.splitlines() if line.startswith("SCAN invocations")]
        assert all("INDEX" in line for line in scans), plan
