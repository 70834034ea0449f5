"""Statements run on libpq directly (store/prepared.py), on PostgreSQL's statement
connections; SQLite has none (its statements are transactions of their own)."""

from __future__ import annotations

import asyncio
import enum
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from psycopg.pq import TransactionStatus

from lakeshore.store import prepared
from lakeshore.store.engine import Store
from lakeshore.store.prepared import Prepared
from lakeshore.store.statements import PostgresqlStatements, Statements
from tests.integration.backends import admin_connection, until_active

ECHO = Prepared.of(
    "test_echo",
    "SELECT CAST(%(word)s AS text), CAST(%(n)s AS int8) + 1, CAST(%(x)s AS float8) * 2,"
    " CAST(%(yes)s AS bool), CAST(%(at)s AS timestamptz) = CAST(%(same)s AS timestamptz),"
    " CAST(%(nothing)s AS text), %(word)s = 'it''s 100%%'",
)


def on_connection(held: Statements) -> psycopg.AsyncConnection[Any]:
    """The psycopg connection PostgreSQL's statements run on."""
    assert isinstance(held, PostgresqlStatements)
    return held.connection


async def _on(store: Store) -> None:
    if store.dialect != "postgresql":
        pytest.skip("PostgreSQL's statement connections")


@pytest.mark.parametrize(
    ("sql", "text", "names"),
    [
        ("SELECT %(a)s", "SELECT $1", ("a",)),
        ("SELECT %(a)s, %(b)s, %(a)s", "SELECT $1, $2, $1", ("a", "b")),
        ("SELECT 1 WHERE 'x' LIKE '%%'", "SELECT 1 WHERE 'x' LIKE '%'", ()),
    ],
)
def test_psycopg_placeholders_are_numbered_in_order(
    sql: str, text: str, names: tuple[str, ...]
) -> None:
    name = f"test_numbered_{len(sql)}"
    statement = Prepared.of(name, sql)
    assert statement == Prepared(f"lakeshore_{name}".encode(), text.encode(), names)


async def test_parameters_go_as_text_and_rows_come_back_as_text(store: Store) -> None:
    await _on(store)
    at = datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)
    parameters: dict[str, Any] = {
        "word": "it's 100%",
        "n": 41,
        "x": 0.25,
        "yes": True,
        "at": at,
        "same": at.astimezone(timezone(timedelta(hours=5))),
        "nothing": None,
    }
    async with store.statement() as held:
        conn = on_connection(held)
        rows = await prepared.fetch(conn, ECHO, parameters)
        again = await prepared.fetch(conn, ECHO, {**parameters, "n": -1, "yes": False})
        assert conn.info.transaction_status == TransactionStatus.IDLE
    assert rows == [("it's 100%", "42", "0.5", "t", "t", None, "t")]
    assert again == [("it's 100%", "0", "0.5", "f", "t", None, "t")]


@pytest.mark.parametrize("value", [datetime(2026, 1, 1), object()])
async def test_a_parameter_without_a_text_form_is_refused_before_sending(
    store: Store, value: object
) -> None:
    await _on(store)
    async with store.statement() as held:
        conn = on_connection(held)
        with pytest.raises((ValueError, TypeError)):
            await prepared.fetch(conn, Prepared.of("test_one", "SELECT %(v)s"), {"v": value})
        assert conn.info.transaction_status == TransactionStatus.IDLE


async def test_the_servers_error_is_raised_as_psycopgs_and_the_connection_stays_usable(
    store: Store,
) -> None:
    await _on(store)
    divide = Prepared.of("test_divide", "SELECT 1 / CAST(%(d)s AS int4)")
    async with store.statement() as held:
        conn = on_connection(held)
        with pytest.raises(psycopg.errors.DivisionByZero):
            await prepared.fetch(conn, divide, {"d": 0})
        assert await prepared.fetch(conn, divide, {"d": 1}) == [("1",)]
        with pytest.raises(psycopg.errors.SyntaxError):
            await prepared.fetch(conn, Prepared.of("test_bad", "SELEC 1"), {})


async def test_a_statement_the_server_forgot_is_prepared_again(store: Store) -> None:
    await _on(store)
    async with store.statement() as held:
        conn = on_connection(held)
        assert await prepared.fetch(conn, ECHO, _echo()) != []
        await conn.execute("DEALLOCATE ALL")  # as a reset of the connection would
        assert (await prepared.fetch(conn, ECHO, _echo()))[0][0] == "again"


def _echo() -> dict[str, Any]:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    return {"word": "again", "n": 1, "x": 1.0, "yes": True, "at": at, "same": at, "nothing": None}


async def test_a_lost_connection_is_psycopgs_operational_error(store: Store) -> None:
    await _on(store)
    async with store.statement() as held:
        conn = on_connection(held)
        pid = conn.info.backend_pid
        with admin_connection(store) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(psycopg.OperationalError):
            await prepared.fetch(conn, ECHO, _echo())
    async with store.statement() as held:  # the lost one was not kept
        conn = on_connection(held)
        assert conn.info.backend_pid != pid
        assert (await prepared.fetch(conn, ECHO, _echo()))[0][0] == "again"


async def test_a_run_cancelled_while_it_waits_leaves_no_busy_connection_behind(
    store: Store,
) -> None:
    await _on(store)
    sleep = Prepared.of("test_sleep", "SELECT pg_sleep(CAST(%(s)s AS float8))")
    started = asyncio.Event()
    pids: list[int] = []

    async def slow() -> None:
        async with store.statement() as held:
            conn = on_connection(held)
            pids.append(conn.info.backend_pid)
            started.set()
            await prepared.fetch(conn, sleep, {"s": 30})

    task = asyncio.create_task(slow())
    async with asyncio.timeout(10):
        await started.wait()
    with admin_connection(store) as admin:
        if not await until_active(admin, "pid = %s", (pids[0],)):
            pytest.fail("the statement never ran on the server")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async with asyncio.timeout(10), store.statement() as held:  # not stuck behind it
        conn = on_connection(held)
        assert conn.info.backend_pid != pids[0]
        assert await prepared.fetch(conn, sleep, {"s": 0}) == [("",)]
    with admin_connection(store) as admin:  # cancelled on the server too, not left running
        assert await until_active(admin, "pid = %s", (pids[0],), active=False)


async def test_an_error_at_the_commit_is_raised_and_nothing_stays(store: Store) -> None:
    """In autocommit the statement's rows come before its commit: an error there (here a
    deferred constraint; a full NOTIFY queue would do the same) is still raised."""
    await _on(store)
    async with store.statement() as held:
        conn = on_connection(held)
        await conn.execute("CREATE TEMPORARY TABLE deferred (v int)")
        await conn.execute(
            "CREATE FUNCTION pg_temp.refuse() RETURNS trigger LANGUAGE plpgsql"
            " AS $$ BEGIN RAISE EXCEPTION 'refused at commit'; END $$"
        )
        await conn.execute(
            "CREATE CONSTRAINT TRIGGER refuse AFTER INSERT ON deferred"
            " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION pg_temp.refuse()"
        )
        insert = Prepared.of("test_deferred", "INSERT INTO deferred VALUES (%(v)s) RETURNING v")
        with pytest.raises(psycopg.errors.RaiseException, match="refused at commit"):
            await prepared.fetch(conn, insert, {"v": 1})
        assert conn.info.transaction_status == TransactionStatus.IDLE
        count = await (await conn.execute("SELECT count(*) FROM deferred")).fetchone()
        assert count == (0,)


async def test_a_statement_whose_table_changed_is_prepared_again(store: Store) -> None:
    await _on(store)
    read = Prepared.of("test_changed", "SELECT * FROM changed WHERE a = %(a)s")
    async with store.statement() as held:
        conn = on_connection(held)
        await conn.execute("CREATE TEMPORARY TABLE changed (a int)")
        await conn.execute("INSERT INTO changed VALUES (1)")
        assert await prepared.fetch(conn, read, {"a": 1}) == [("1",)]
        await conn.execute("ALTER TABLE changed ADD COLUMN b text")
        assert await prepared.fetch(conn, read, {"a": 1}) == [("1", None)]


async def test_a_nul_in_a_text_parameter_is_refused_not_cut(store: Store) -> None:
    await _on(store)
    async with store.statement() as held:
        conn = on_connection(held)
        with pytest.raises(psycopg.DataError, match="NUL"):
            await prepared.fetch(conn, ECHO, {**_echo(), "word": "ab\x00cd"})


def test_one_name_stands_for_one_statement() -> None:
    assert Prepared.of("test_twice", "SELECT 1") == Prepared.of("test_twice", "SELECT 1")
    with pytest.raises(ValueError, match="another text"):
        Prepared.of("test_twice", "SELECT 2")


def test_numbers_go_as_numbers_whatever_their_class() -> None:
    class Level(enum.IntEnum):
        HIGH = 3

    assert prepared._text(Level.HIGH) == b"3"
    assert prepared._text(True) == b"t"
    assert prepared._text(1e16) == b"1e+16"
    assert prepared._text(float("inf")) == b"inf"
