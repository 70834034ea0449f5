"""The store itself, on SQLite and PostgreSQL: schema, migrations, types, constraints."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Connection, bindparam, func, insert, inspect, select, text
from sqlalchemy.exc import IntegrityError, OperationalError, StatementError

from lakeshore.domain.queue import parse_spec
from lakeshore.errors import InvalidInput, StoreUnavailable
from lakeshore.store import engine as engine_module
from lakeshore.store import queues as queue_store
from lakeshore.store import sqlite_statements as sqlite_module
from lakeshore.store import statements as statements_module
from lakeshore.store.driver import conninfo
from lakeshore.store.engine import Store, migrate, parse_url
from lakeshore.store.sqlite_statements import SqliteStatements
from lakeshore.store.statements import PostgresqlStatements, Statements
from lakeshore.store.tables import invocations, metadata, namespaces
from lakeshore.store.types import UTCDateTime
from tests.integration.backends import admin_connection, until_active

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


async def _namespace(store: Store, name: str = "default") -> str:
    async with store.write() as conn:
        await conn.execute(insert(namespaces).values(id=f"ns_{name}", name=name, created_at=NOW))
    return f"ns_{name}"


async def test_migrations_match_the_tables(store: Store) -> None:
    def diff(conn: Connection) -> list[object]:
        return list(compare_metadata(MigrationContext.configure(conn), metadata))

    async with store.read() as conn:
        assert await conn.run_sync(diff) == []


async def test_every_table_is_created(store: Store) -> None:
    async with store.read() as conn:
        names = await conn.run_sync(lambda c: set(inspect(c).get_table_names()))
    assert {
        "namespaces",
        "tokens",
        "queues",
        "providers",
        "workers",
        "worker_queues",
        "retired_workers",
        "invocations",
        "stream_items",
        "elasticity_events",
        "controller_state",
        "launches",
    } <= names


async def test_hot_query_indexes_exist(store: Store) -> None:
    async with store.read() as conn:
        indexes = await conn.run_sync(
            lambda c: {i["name"] for i in inspect(c).get_indexes("invocations")}
        )
    assert {
        "ix_invocations_claimable_priority",
        # counts by state, filtered lists, and the fifo / filo claims (state = 'pending')
        "ix_invocations_queue_id_state_created_at_id",
        "ix_invocations_queue_id_created_at_id",  # a queue's invocations, newest first
        "ix_invocations_worker_state",  # rows with a worker only, by state
    } <= indexes
    assert "ix_invocations_queue_id_state" not in indexes  # replaced by the wider one
    assert "ix_invocations_claimable" not in indexes  # the wider one, for state = 'pending'


async def test_a_worker_s_running_invocations_are_found_without_its_history(
    store: Store,
) -> None:
    """What a worker runs now (``worker_id = ? AND state = ?``, as the claims, the
    heartbeats and a handed submit ask it) is read from the index, not found by reading
    every invocation the worker ever finished, nor every other worker's running ones,
    and looking at each."""
    ns = await _namespace(store)
    async with store.write() as conn:
        await queue_store.insert_queue(
            conn, id="q_1", namespace_id=ns, spec=parse_spec({"name": "a"}), now=NOW
        )
        rows = [
            {
                "id": f"inv_{n}",
                "namespace_id": ns,
                "queue_id": "q_1",
                "queue_name": "a",
                "fn": "m:f",
                "args": [],
                "kwargs": {},
                "state": "running" if n in (0, 300) or n > 600 else "succeeded",
                # its own history, then other workers' running invocations
                "worker_id": "w_1" if n <= 300 else f"w_{n}",
                "available_at": NOW,
                "created_at": NOW,
            }
            for n in range(900)
        ]
        await conn.execute(insert(invocations), rows)
    query = select(func.count()).where(
        invocations.c.worker_id == "w_1", invocations.c.state == "running"
    )
    async with store.read() as conn:
        assert (await conn.execute(query)).scalar_one() == 2
        sql = str(query.compile(conn.sync_connection, compile_kwargs={"render_postcompile": True}))
        params = query.compile(conn.sync_connection).params
        if store.dialect == "sqlite":
            found = await conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql, tuple(params.values()))
            plan = " ".join(str(row[-1]) for row in found)
            assert "ix_invocations_worker_state (worker_id=? AND state=?)" in plan, plan
        else:
            await conn.exec_driver_sql("ANALYZE invocations")
            await conn.exec_driver_sql("SET LOCAL enable_seqscan = off")  # a small table
            found = await conn.exec_driver_sql("EXPLAIN (ANALYZE, COSTS OFF) " + sql, params)
            plan = "\n".join(str(row[0]) for row in found)
            assert "Rows Removed by Filter" not in plan, plan  # none of the 599 read


def test_migrating_twice_is_harmless(database_url: str) -> None:
    migrate(parse_url(database_url))
    migrate(parse_url(database_url))


async def test_timestamps_come_back_aware_and_exact(store: Store) -> None:
    ns = await _namespace(store)
    when = datetime(2026, 3, 4, 5, 6, 7, 890123, tzinfo=UTC) + timedelta()
    async with store.write() as conn:
        await queue_store.insert_queue(
            conn, id="q_1", namespace_id=ns, spec=parse_spec({"name": "a"}), now=when
        )
    async with store.read() as conn:
        queue = await queue_store.get_queue(conn, ns, "a")
    assert queue is not None
    assert queue.created_at == when
    assert queue.created_at.tzinfo is not None


async def test_a_queue_round_trips_every_field(store: Store) -> None:
    ns = await _namespace(store)
    spec = parse_spec(
        {
            "name": "full",
            "description": "d",
            "kind": "boltzmann",
            "kindParams": {"temperature": 2.0},
            "admission": {"max_depth": 5, "on_full": "block"},
            "reservedSlots": 1,
            "authPolicy": {"submit": ["a"], "claim": []},
            "providerRef": "p",
            "elasticity": {
                "kind": "pool_with_threshold",
                "min": 1,
                "max": 3,
                "pool": "fleet",
                "extra": 1,
            },
            "daemonTemplate": {"capacity": 2, "cloudTags": {"k": "v"}},
            "customScalerUdf": "pkg.mod:fn",
            "serverNodeId": "n1",
        }
    )
    async with store.write() as conn:
        await queue_store.insert_queue(conn, id="q_1", namespace_id=ns, spec=spec, now=NOW)
    async with store.read() as conn:
        queue = await queue_store.get_queue(conn, ns, "full")
    assert queue is not None and queue.spec == spec


async def test_queue_names_are_unique_per_namespace_in_the_store(store: Store) -> None:
    ns = await _namespace(store)
    other = await _namespace(store, "other")
    spec = parse_spec({"name": "a"})
    async with store.write() as conn:
        await queue_store.insert_queue(conn, id="q_1", namespace_id=ns, spec=spec, now=NOW)
        await queue_store.insert_queue(conn, id="q_2", namespace_id=other, spec=spec, now=NOW)
    with pytest.raises(IntegrityError):
        async with store.write() as conn:
            await queue_store.insert_queue(conn, id="q_3", namespace_id=ns, spec=spec, now=NOW)


async def test_a_failed_write_leaves_nothing_behind(store: Store) -> None:
    ns = await _namespace(store)
    with pytest.raises(RuntimeError):
        async with store.write() as conn:
            await queue_store.insert_queue(
                conn, id="q_1", namespace_id=ns, spec=parse_spec({"name": "a"}), now=NOW
            )
            raise RuntimeError("boom")
    async with store.read() as conn:
        assert await queue_store.get_queue(conn, ns, "a") is None


async def test_pool_is_copied_out_for_the_controller(store: Store) -> None:
    ns = await _namespace(store)
    spec = parse_spec({"name": "a", "elasticity": {"kind": "fixed", "pool": "fleet"}})
    async with store.write() as conn:
        await queue_store.insert_queue(conn, id="q_1", namespace_id=ns, spec=spec, now=NOW)
    from lakeshore.store.tables import queues

    async with store.read() as conn:
        pool = (await conn.execute(select(queues.c.pool))).scalar_one()
    assert pool == "fleet"


@pytest.mark.parametrize("raw", ["mysql://x/y", "not a url", "redis://localhost"])
def test_unsupported_database_urls_are_refused_clearly(raw: str) -> None:
    with pytest.raises(InvalidInput):
        parse_url(raw)


def test_postgres_urls_use_psycopg() -> None:
    assert parse_url("postgresql://u@h/db").drivername == "postgresql+psycopg"
    assert parse_url("postgres://u@h/db").drivername == "postgresql+psycopg"


async def test_sqlite_runs_in_wal_mode_with_foreign_keys(store: Store) -> None:
    if store.dialect != "sqlite":
        pytest.skip("SQLite pragmas")
    async with store.read() as conn:
        journal = (await conn.exec_driver_sql("PRAGMA journal_mode")).scalar_one()
        foreign_keys = (await conn.exec_driver_sql("PRAGMA foreign_keys")).scalar_one()
    assert (journal, foreign_keys) == ("wal", 1)


async def test_sqlite_writers_queue_in_process_and_a_long_wait_is_a_clear_503(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite has one writer at a time: this process's writers wait their turn on a lock
    (not in SQLite's sleeping busy handler), and one kept waiting past the bound gets
    StoreUnavailable rather than hanging."""
    if store.dialect != "sqlite":
        assert store._writer is None  # PostgreSQL takes concurrent writers
        return
    order: list[str] = []

    inside = asyncio.Event()

    async def write(name: str, hold: asyncio.Event | None = None) -> None:
        async with store.write() as conn:
            order.append(f"{name} in")
            inside.set()
            await conn.execute(insert(namespaces).values(id=name, name=name, created_at=NOW))
            if hold is not None:
                await hold.wait()
            order.append(f"{name} out")

    release = asyncio.Event()
    first = asyncio.create_task(write("ns_a", release))
    await inside.wait()
    monkeypatch.setattr(engine_module, "WRITE_WAIT_S", 0.05)
    with pytest.raises(StoreUnavailable, match="stayed busy"):
        await write("ns_b")
    monkeypatch.setattr(engine_module, "WRITE_WAIT_S", 10.0)
    second = asyncio.create_task(write("ns_c"))
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(first, second)
    assert order == ["ns_a in", "ns_a out", "ns_c in", "ns_c out"]


async def _backends(store: Store) -> set[int]:
    async with store.read() as conn:
        return {(await conn.exec_driver_sql("SELECT pg_backend_pid()")).scalar_one()}


async def test_a_pooled_connection_the_server_closed_is_replaced_before_use(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL: a connection back in the pool is looked at, not pinged, when it is
    taken again soon. One whose backend was terminated meanwhile (a restart, an admin's
    pg_terminate_backend) is noticed by its socket and replaced, so no statement fails;
    one idle past PING_IDLE_S is pinged (a round trip) first."""
    if store.dialect != "postgresql":
        pytest.skip("PostgreSQL's pool")
    [pid] = await _backends(store)
    with admin_connection(store) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [pid])
        for _ in range(500):  # the backend is gone once it no longer lists itself
            if not admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone():
                break
            await asyncio.sleep(0.01)
    async with store.write() as conn:  # would raise OperationalError on the dead one
        await conn.execute(insert(namespaces).values(id="ns_a", name="a", created_at=NOW))
    [replacement] = await _backends(store)
    assert replacement != pid

    pings: list[object] = []
    real_ping = store.engine.dialect.do_ping
    monkeypatch.setattr(store.engine.dialect, "do_ping", lambda c: pings.append(c) or real_ping(c))
    await _backends(store)
    assert pings == []  # used a moment ago: no round trip
    monkeypatch.setattr(engine_module, "PING_IDLE_S", -1.0)
    assert await _backends(store) == {replacement}
    assert len(pings) == 1


def on_connection(held: Statements) -> psycopg.AsyncConnection[Any]:
    """The psycopg connection PostgreSQL's statements run on."""
    assert isinstance(held, PostgresqlStatements)
    return held.connection


async def _statement_backend(store: Store) -> int:
    async with store.statement() as held:
        conn = on_connection(held)
        row = await (await conn.execute("SELECT pg_backend_pid()")).fetchone()
    assert row is not None
    return int(row[0])


async def _gone(admin: psycopg.Connection[tuple[object, ...]], pid: int) -> bool:
    for _ in range(500):  # bounded: a backend is gone once it no longer lists itself
        if not admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone():
            return True
        await asyncio.sleep(0.01)
    return False


async def test_statement_connections_are_checked_without_a_round_trip_and_closed_with_the_store(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL: one-statement writes run on psycopg connections of the store's own,
    in autocommit. One taken again soon is reused without a ping; one whose backend was
    terminated meanwhile is noticed by its socket and replaced, so no statement fails;
    one idle past PING_IDLE_S is pinged first; the store's close closes them."""
    store = Store(engine_module.create_engine_for(parse_url(database_url)))
    try:
        if store.dialect != "postgresql":
            pytest.skip("PostgreSQL's statement connections")
        pid = await _statement_backend(store)
        assert await _statement_backend(store) == pid  # reused
        with admin_connection(store) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", [pid])
            assert await _gone(admin, pid)
            replacement = await _statement_backend(store)  # would raise on the dead one
            assert replacement != pid

            pings: list[str] = []
            real_execute = psycopg.AsyncConnection.execute

            async def spy(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
                pings.append(str(query))
                return await real_execute(self, query, *args, **kwargs)

            monkeypatch.setattr(psycopg.AsyncConnection, "execute", spy)
            assert await _statement_backend(store) == replacement
            assert pings == ["SELECT pg_backend_pid()"]  # used a moment ago: no ping
            monkeypatch.setattr(statements_module, "PING_IDLE_S", -1.0)
            assert await _statement_backend(store) == replacement
            assert pings[1:] == ["SELECT 1", "SELECT pg_backend_pid()"]
            await store.close()
            assert await _gone(admin, replacement)
    finally:
        await store.close()


async def test_a_statement_cancelled_mid_way_leaves_no_busy_connection_behind(
    store: Store,
) -> None:
    """PostgreSQL: a statement whose request is cancelled while it runs (a client that
    hung up) does not hand its connection, still busy, to the next statement."""
    if store.dialect != "postgresql":
        pytest.skip("PostgreSQL's statement connections")
    started = asyncio.Event()

    async def slow() -> None:
        async with store.statement() as held:
            conn = on_connection(held)
            started.set()
            await conn.execute("SELECT pg_sleep(30)")

    task = asyncio.create_task(slow())
    async with asyncio.timeout(10):
        await started.wait()
    with admin_connection(store) as admin:
        if not await until_active(admin, "query = 'SELECT pg_sleep(30)'"):
            pytest.fail("the statement never ran on the server")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        async with asyncio.timeout(10):  # not stuck behind the cancelled sleep
            assert await _statement_backend(store) > 0
        running = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(30)'"
            " AND state = 'active'"
        ).fetchone()
        assert running == (0,)  # cancelled on the server too, not left running


async def test_statement_connections_wait_for_a_free_one_then_give_up(store: Store) -> None:
    """PostgreSQL: at most ``size`` connections are out; the next checkout waits for one
    to come back, and gives up after ``wait_s`` (psycopg's ConnectionTimeout, raised as
    SQLAlchemy's OperationalError as every connection error of the store is)."""
    if store.dialect != "postgresql":
        pytest.skip("PostgreSQL's statement connections")
    pool = statements_module.StatementConnections(conninfo(store.engine.url), size=1, wait_s=0.2)
    try:
        async with pool.checkout() as first:
            async with asyncio.timeout(5):  # bounded, should it never give up
                with pytest.raises(OperationalError, match="was free") as refused:
                    async with pool.checkout():
                        pytest.fail("a second connection was handed out")
                assert isinstance(refused.value.orig, psycopg.errors.ConnectionTimeout)
            raw = first.connection
            mine = (await (await raw.execute("SELECT pg_backend_pid()")).fetchone() or [0])[0]
            waiting = asyncio.create_task(_backend_of(pool))  # waits for the one that is out
            await asyncio.sleep(0)
        async with asyncio.timeout(5):
            assert await waiting == mine  # the same connection, handed on
    finally:
        await pool.close()


async def _backend_of(pool: statements_module.StatementConnections) -> int:
    async with pool.checkout() as held:
        row = await (await held.connection.execute("SELECT pg_backend_pid()")).fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
def threads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The thread each SQLite statement's transaction ran on, in order."""
    ran: list[int] = []
    real = sqlite_module._transaction

    def noted(db: Any, statement: Any, parameters: dict[str, Any]) -> Any:
        ran.append(threading.get_ident())
        return real(db, statement, parameters)

    monkeypatch.setattr(sqlite_module, "_transaction", noted)
    return ran


async def test_a_sqlite_statement_is_one_transaction_on_the_loop_s_own_thread(
    store: Store, monkeypatch: pytest.MonkeyPatch, threads: list[int]
) -> None:
    """SQLite: a one-statement write is a write transaction made whole on the event
    loop's thread, its row seen at once by the store's reads. Its connection waits for no
    lock and never checkpoints the WAL: every CHECKPOINT_EVERY statements a checkpoint
    runs on the statement thread, and the statement after it (which rewinds the log)
    too. However many statements, the log does not outgrow one round of them."""
    if store.dialect != "sqlite":
        pytest.skip("SQLite's statements")
    await _namespace(store)
    monkeypatch.setattr(sqlite_module, "CHECKPOINT_EVERY", 10)
    async with store.statement() as conn:
        assert isinstance(conn, SqliteStatements)
        rows = await conn.execute(
            insert(namespaces)
            .values(id="ns_b", name="b", created_at=NOW)
            .returning(namespaces.c.id),
            {},
        )
    assert rows == [("ns_b",)]
    loop_thread = threading.get_ident()
    assert threads == [loop_thread]
    async with store.read() as read:
        assert (
            await read.execute(select(namespaces.c.name).where(namespaces.c.id == "ns_b"))
        ).scalar_one() == "b"
    async with store.statement() as conn:
        assert isinstance(conn, SqliteStatements)
        inline = conn._inline.raw_connection()
        try:
            cursor = inline.driver_connection
            assert cursor is not None
            pragmas = [
                cursor.execute(f"PRAGMA {name}").fetchone()[0]
                for name in ("busy_timeout", "wal_autocheckpoint")
            ]
        finally:
            inline.close()
    assert pragmas == [0, 0]
    # its time went in as the store's own writes keep one (fixed-width text, compared in
    # SQL), converted by the column's type as SQLAlchemy's execution would
    with contextlib.closing(sqlite3.connect(store.engine.url.database or "")) as db:
        stamps = db.execute("SELECT id, created_at FROM namespaces ORDER BY id").fetchall()
    assert stamps == [("ns_b", "2026-01-01 12:00:00.000000"), ("ns_default", stamps[1][1])]
    assert stamps[1][1] == stamps[0][1]

    wal = Path(f"{store.engine.url.database}-wal")
    sizes = []
    for n in range(60):
        async with store.statement() as conn:
            assert isinstance(conn, SqliteStatements)
            await conn.execute(
                insert(namespaces).values(id=f"ns_{n}", name=f"n{n}", created_at=NOW), {}
            )
        if n % 10 == 9:
            sizes.append(await asyncio.to_thread(lambda: wal.stat().st_size))
    assert threads[10] != loop_thread  # the 11th statement, after the first checkpoint
    assert threads.count(loop_thread) == len(threads) - 6  # after each of 6 checkpoints
    assert max(sizes) == sizes[0]  # rewound after each checkpoint, never grown


async def test_a_sqlite_statement_that_finds_the_database_busy_waits_on_its_thread(
    store: Store, threads: list[int]
) -> None:
    """Another process's write holds the lock: the statement waits on the statement
    thread, not on the loop, and commits once the lock is free. A caller cancelled while
    it waits keeps this process's writer lock until its transaction has ended, so no
    other writer of this process starts against it."""
    if store.dialect != "sqlite":
        pytest.skip("SQLite's statements")
    await _namespace(store)
    other = sqlite3.connect(store.engine.url.database or "", isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # as another process's writer would

        async def write(ns_id: str) -> None:
            async with store.statement() as conn:
                assert isinstance(conn, SqliteStatements)
                await conn.execute(
                    insert(namespaces).values(id=ns_id, name=ns_id, created_at=NOW), {}
                )

        waiting = asyncio.create_task(write("ns_d"))
        for _ in range(5):  # the loop goes on while it waits
            await asyncio.sleep(0.01)
        assert not waiting.done()
        other.execute("COMMIT")
        await asyncio.wait_for(waiting, timeout=10)
        loop_thread = threading.get_ident()
        assert threads[0] == loop_thread and threads[1:] and loop_thread not in threads[1:]

        other.execute("BEGIN IMMEDIATE")
        cancelled = asyncio.create_task(write("ns_e"))
        for _ in range(5):  # on the thread now, waiting for the lock
            await asyncio.sleep(0.01)
        cancelled.cancel()
        await asyncio.sleep(0)
        assert store._writer is not None and store._writer.locked()
        other.execute("COMMIT")
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert not store._writer.locked()
    finally:
        other.close()
    async with store.read() as read:  # both committed
        names = await read.execute(
            select(namespaces.c.name).where(namespaces.c.id.in_(["ns_d", "ns_e"]))
        )
        assert sorted(names.scalars()) == ["ns_d", "ns_e"]


async def test_closed_sqlite_statements_write_nothing(tmp_path: Path) -> None:
    url = parse_url(f"sqlite:///{tmp_path}/closed.db")
    migrate(url)
    statements = SqliteStatements(url.set(drivername="sqlite"), engine_module._writing)
    await statements.close()
    with pytest.raises(RuntimeError, match="closed"):
        await statements.execute(insert(namespaces).values(id="ns_x", name="x", created_at=NOW), {})
    with contextlib.closing(sqlite3.connect(tmp_path / "closed.db")) as db:
        assert db.execute("SELECT count(*) FROM namespaces").fetchone() == (0,)


async def test_a_sqlite_statement_that_fails_writes_nothing_and_leaves_the_lock_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A statement the database refuses is raised as SQLAlchemy's error, one missing a
    parameter as its ``StatementError``; neither writes anything, and the next statement
    commits. A connection its rollback could not end is closed (its lock with it), not
    kept for the next statement."""
    url = parse_url(f"sqlite:///{tmp_path}/failing.db")
    migrate(url)
    statements = SqliteStatements(url.set(drivername="sqlite"), engine_module._writing)
    path = str(tmp_path / "failing.db")

    def stored() -> list[str]:
        with contextlib.closing(sqlite3.connect(path)) as db:
            return [row[0] for row in db.execute("SELECT id FROM namespaces ORDER BY id")]

    try:
        row = insert(namespaces).values(id="ns_a", name="a", created_at=NOW)
        await statements.execute(row, {})
        with pytest.raises(IntegrityError):  # the same id again
            await statements.execute(row, {})
        named = text("INSERT INTO namespaces (id, name, created_at) VALUES (:id, :name, :at)")
        with pytest.raises(StatementError, match="missing or refused"):
            await statements.execute(named.bindparams(bindparam("at", type_=UTCDateTime())), {})
        with pytest.raises(StatementError, match="naive"):  # refused by the column's type
            await statements.execute(
                named.bindparams(bindparam("at", type_=UTCDateTime())),
                {"id": "ns_n", "name": "n", "at": datetime(2026, 1, 1)},
            )
        await statements.execute(insert(namespaces).values(id="ns_b", name="b", created_at=NOW), {})
        assert await asyncio.to_thread(stored) == ["ns_a", "ns_b"]

        # a transaction its rollback could not end: the connection goes, and its lock
        real = sqlite_module._transaction

        def stuck(db: Any, compiled: Any, parameters: Any) -> Any:
            db.execute("BEGIN IMMEDIATE")
            raise sqlite3.OperationalError("disk I/O error")

        monkeypatch.setattr(sqlite_module, "_transaction", stuck)
        with pytest.raises(sqlite3.OperationalError):
            await statements.execute(row, {})
        assert statements._inline_raw is None
        with contextlib.closing(sqlite3.connect(path, timeout=0)) as other:
            other.execute("BEGIN IMMEDIATE")  # no lock left behind
            other.execute("ROLLBACK")
        monkeypatch.setattr(sqlite_module, "_transaction", real)
        await statements.execute(insert(namespaces).values(id="ns_c", name="c", created_at=NOW), {})
        assert await asyncio.to_thread(stored) == ["ns_a", "ns_b", "ns_c"]
    finally:
        await statements.close()
