"""Connecting to the store and keeping its schema current.

One URL chooses the engine: ``sqlite:///path`` (the embedded default, WAL mode) or
``postgresql://…`` (production). Both are driven through SQLAlchemy's async engine —
aiosqlite and psycopg 3 — and migrated with Alembic on a synchronous connection at start.
Several servers starting at once on one PostgreSQL take an advisory lock, so exactly one
of them applies a migration.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from importlib import resources
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine, event, pool, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DisconnectionError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from lakeshore import files
from lakeshore.errors import InvalidInput, StoreUnavailable
from lakeshore.store.driver import conninfo
from lakeshore.store.liveness import PING_IDLE_S, unsure
from lakeshore.store.sqlite_statements import SqliteStatements
from lakeshore.store.statements import StatementConnections, StatementPool, Statements

_MIGRATION_LOCK = 0x1A4E5_0001  # pg_advisory_lock key for schema changes
_WRITE = "lakeshore_write"


def parse_url(raw: str) -> URL:
    """Validate a database URL and pin the drivers Lakeshore ships with."""
    try:
        url = make_url(raw)
    except ArgumentError as exc:
        raise InvalidInput(f"not a database URL: {raw!r}", field="database_url") from exc
    backend = url.get_backend_name()
    if backend == "sqlite":
        return url.set(drivername="sqlite")
    if backend in ("postgresql", "postgres"):
        return url.set(drivername="postgresql+psycopg")
    raise InvalidInput(
        f"unsupported database {backend!r}: use sqlite:///PATH or postgresql://…",
        field="database_url",
    )


def async_url(url: URL) -> URL:
    return url.set(drivername="sqlite+aiosqlite") if url.get_backend_name() == "sqlite" else url


def _sqlite_setup(engine: Any, *, foreign_keys: bool = True) -> None:
    """WAL, foreign keys (unless told not: see :func:`migrate`), a busy timeout, and
    transactions Lakeshore opens itself.

    The stdlib driver's own transaction handling is switched off so that a write starts
    with ``BEGIN IMMEDIATE``: it waits for the write lock up front instead of failing
    half-way when a read turns into a write.
    """

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA foreign_keys={'ON' if foreign_keys else 'OFF'}")
        cursor.execute("PRAGMA busy_timeout=10000")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        write = conn.get_execution_options().get(_WRITE, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def _writing(engine: Engine) -> Engine:
    """A synchronous SQLite engine set up as the store's, whose transactions write."""
    _sqlite_setup(engine)
    return engine.execution_options(**{_WRITE: True})


_IDLE_SINCE = "lakeshore_idle_since"


def _postgresql_liveness(engine: Any) -> None:
    """Check a pooled connection at checkout, without a round trip when it was in use a
    moment ago and nothing came from the server since. ``pool_pre_ping`` sent
    ``SELECT 1`` before every transaction: one round trip in five of a single submit. A
    connection the server closed (a restart, a terminated backend) is still caught: its
    socket turns readable, and it is pinged; so is one idle past :data:`PING_IDLE_S`. A
    dead one is replaced by the pool (it retries a checkout that raises
    :class:`DisconnectionError`) before any statement runs on it."""

    @event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_connection: Any, record: Any) -> None:
        record.info[_IDLE_SINCE] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checked_out(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        idle_since = record.info.pop(_IDLE_SINCE, None)
        if idle_since is None:
            return  # just connected
        fresh = time.monotonic() - idle_since <= PING_IDLE_S
        if fresh and not unsure(record.driver_connection):
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:
            raise DisconnectionError("this pooled connection no longer answers") from exc


def create_engine_for(url: URL, *, pool_size: int = 10) -> AsyncEngine:
    if url.get_backend_name() == "sqlite":
        engine = create_async_engine(async_url(url))
        _sqlite_setup(engine.sync_engine)
        return engine
    engine = create_async_engine(url, pool_size=pool_size, max_overflow=pool_size)
    _postgresql_liveness(engine.sync_engine)
    return engine


def _alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(resources.files("lakeshore.store") / "migrations"))
    return cfg


@functools.cache
def head_revision() -> str | None:
    """The newest migration this installation ships."""
    return ScriptDirectory.from_config(_alembic_config()).get_current_head()


def migrate(url: URL) -> None:
    """Bring the schema to the newest revision (idempotent; safe with concurrent servers).

    On SQLite the migrations run with foreign keys off, as SQLite asks of one that
    rebuilds a table (its only way to drop a constraint): with them on, dropping the
    old copy would first delete its rows, and cascade to the tables that refer to it.
    Such a migration checks the keys itself before it commits (``PRAGMA
    foreign_key_check``, see 0007). The pragma cannot change inside a transaction, so
    it is set as the connection opens, on this connection only."""
    sync = create_engine(url, poolclass=pool.NullPool)
    if url.get_backend_name() == "sqlite":
        _sqlite_setup(sync, foreign_keys=False)
    cfg = _alembic_config()
    try:
        with sync.connect() as conn:
            if url.get_backend_name() == "postgresql":
                conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _MIGRATION_LOCK})
                conn.commit()
            try:
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, "head")
                conn.commit()
            finally:
                if url.get_backend_name() == "postgresql":
                    conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _MIGRATION_LOCK})
                    conn.commit()
    finally:
        sync.dispose()


def prepare(url: URL) -> None:
    """Make sure a SQLite file exists, 0600 in a folder of its own user's (see
    :mod:`lakeshore.files`), then migrate."""
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        files.private_sqlite_file(Path(url.database).expanduser())
    migrate(url)


WRITE_WAIT_S = 10.0  # as long as SQLite's own busy_timeout
STATEMENT_CONNECTIONS = 10  # PostgreSQL: one-statement writes at once (see :mod:`.statements`)


class Store:
    """The connection pool, and the two ways in: a read, or a write transaction.

    On SQLite, where one writer at a time holds the database, this process's writers
    queue on an in-process lock before they begin: the next one starts the moment the
    last commits, where SQLite's busy handler would have it sleep and poll (1, 2, 5, 10 …
    ms), which on a busy server put tens of milliseconds into claims and submits."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self._writer = asyncio.Lock() if engine.dialect.name == "sqlite" else None
        self._statements: StatementPool
        if self._writer is not None:
            self._statements = SqliteStatements(
                engine.url.set(drivername="sqlite"), _writing, self._one_writer
            )
        else:
            self._statements = StatementConnections(
                conninfo(engine.url), STATEMENT_CONNECTIONS, WRITE_WAIT_S
            )

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncConnection]:
        async with self.engine.connect() as conn, conn.begin():
            yield conn

    @asynccontextmanager
    async def write(self) -> AsyncIterator[AsyncConnection]:
        async with self._one_writer(), self.engine.connect() as conn:
            conn = await conn.execution_options(**{_WRITE: True})
            async with conn.begin():
                yield conn

    def statement(self) -> AbstractAsyncContextManager[Statements]:
        """:class:`~.statements.Statements` for one write statement at a time, each its
        own transaction, run the fastest way this store allows: on PostgreSQL a
        statement prepared on psycopg's own connection, in autocommit (no ``BEGIN`` and
        ``COMMIT`` round trips around it, and none of SQLAlchemy's work:
        :mod:`.statements`), whose connection errors are raised as SQLAlchemy's, as
        every other store call's are; on SQLite a write transaction made on the event
        loop's thread, under this process's writer lock (:mod:`.sqlite_statements`)."""
        return self._statements.checkout()

    @asynccontextmanager
    async def _one_writer(self) -> AsyncIterator[None]:
        if self._writer is None:
            yield
            return
        try:
            async with asyncio.timeout(WRITE_WAIT_S):
                await self._writer.acquire()
        except TimeoutError:
            raise StoreUnavailable(
                f"the database stayed busy for {WRITE_WAIT_S:.0f} s; retry shortly"
            ) from None
        try:
            yield
        finally:
            self._writer.release()

    async def ping(self) -> None:
        async with self.read() as conn:
            await conn.execute(text("SELECT 1"))

    async def schema_revision(self) -> str | None:
        """The migration the store's schema is at (``None``: never migrated)."""
        async with self.read() as conn:
            return await conn.run_sync(
                lambda sync: MigrationContext.configure(sync).get_current_revision()
            )

    async def close(self) -> None:
        await self._statements.close()
        await self.engine.dispose()
