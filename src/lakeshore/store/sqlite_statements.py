"""SQLite's side of the one-statement interface (:mod:`.statements`).

On SQLite the async engine runs each call on aiosqlite's thread and back (begin,
execute, commit, checkin), with greenlets around them: about 1 ms of CPU for a one-row
insert, against 0.26 ms for the same transaction made whole on one thread with
SQLAlchemy's synchronous engine. :class:`SqliteStatements` makes each statement a write
transaction (``BEGIN IMMEDIATE``, the statement, ``COMMIT``) on the event loop's own
thread, on one connection. Its caller holds the store's writer lock, so it never
contends with this process's other writers. The transaction is made on the sqlite3
connection itself, the statement compiled by SQLAlchemy once (its SQL, and the
conversion of each parameter its type asks for: a time as the column keeps it): the
synchronous engine's own ``begin``, ``execute`` and ``commit`` cost 0.36-0.45 ms of CPU
a statement, and 1.3 ms when its code was cold (an idle server's next submit), where the
connection's own took 0.06 ms and 0.3 ms.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, TypeVar

from sqlalchemy import event, pool
from sqlalchemy.engine import URL, Dialect, Engine, create_engine
from sqlalchemy.exc import DBAPIError, OperationalError, StatementError
from sqlalchemy.pool import PoolProxiedConnection
from sqlalchemy.sql import ClauseElement

from lakeshore.store.statements import OneStatement, Parameters

log = logging.getLogger("lakeshore.store")
T = TypeVar("T")


# a checkpoint of the WAL, on the statement thread, after this many statements (whose
# commits on the loop never checkpoint: see SqliteStatements)
CHECKPOINT_EVERY = 500


class SqliteStatements:
    """One-statement write transactions on SQLite, each made whole on the event loop's
    own thread. ``setup`` prepares an engine as the store's own (pragmas, ``BEGIN
    IMMEDIATE``: see :func:`lakeshore.store.engine.create_engine_for`).

    A hop to a thread and back (two wake-ups, two hand-overs of the GIL) cost more CPU
    than the transaction itself: 0.2-0.3 ms of a real server's CPU a single submit
    (docs/architecture.md). The loop does not wait on another writer or on the disk for
    it: this process's writers queue on the store's writer lock before they begin (the
    caller holds it); the loop's connection waits for no lock (``busy_timeout`` 0), so
    while another process writes, the statement goes to a thread of its own and waits
    there as any write would; and its commits never checkpoint the WAL
    (``wal_autocheckpoint`` 0). Every :data:`CHECKPOINT_EVERY` statements the caller
    waits, on that thread and still holding the writer lock, for a checkpoint that then
    copies the whole log; the next statement, which starts the log afresh and syncs its
    header, runs on the thread too."""

    def __init__(
        self,
        url: URL,
        setup: Callable[[Engine], Engine],
        writer: Callable[[], AbstractAsyncContextManager[None]] | None = None,
    ) -> None:
        self._writer = writer or contextlib.nullcontext
        # one connection, used on the loop's thread; it waits for no lock, opening included
        base = create_engine(url, poolclass=pool.StaticPool, connect_args={"timeout": 0})
        self._inline = setup(base)

        @event.listens_for(base, "connect")
        def _never_waits(dbapi_connection: Any, _record: Any) -> None:  # after setup's
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA busy_timeout=0")
            cursor.execute("PRAGMA wal_autocheckpoint=0")
            cursor.close()

        # one connection, made and used on the one thread: a statement that found the
        # database busy, the checkpoints, and the statement after each
        self._engine = setup(create_engine(url, poolclass=pool.StaticPool))
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="sqlite-statements")
        self._closed = False
        self._since_checkpoint = 0
        self._restarting = False  # a checkpoint copied the log: the next write rewinds it
        self._inline_raw: PoolProxiedConnection | None = None  # the loop's, once opened
        self.dialect: Dialect = self._engine.dialect

    @asynccontextmanager
    async def checkout(self) -> AsyncIterator[SqliteStatements]:
        """These statements, for the caller alone: under ``writer`` (the store's lock,
        which this process's write transactions take too)."""
        async with self._writer():
            yield self

    def fetch(
        self, statement: OneStatement, parameters: Parameters
    ) -> Coroutine[Any, Any, Sequence[tuple[Any, ...]]]:
        if statement.for_sqlite is not None:
            parameters = statement.for_sqlite(parameters)
        return self.execute(statement.sqlite, parameters)

    async def execute(
        self, statement: ClauseElement, parameters: Mapping[str, Any]
    ) -> Sequence[tuple[Any, ...]]:
        """Run ``statement`` as a transaction of its own: the rows it returned, each a
        tuple of the values as SQLite keeps them (no conversion by the columns' types).
        An error is raised as SQLAlchemy's (``OperationalError``, ``IntegrityError``…),
        as the store's other calls raise theirs."""
        if self._closed:
            raise RuntimeError("the store is closed")
        compiled = _compiled(statement, self.dialect)
        if self._restarting:
            self._restarting = False
            rows = await self._on_thread(_on_engine, self._engine, compiled, parameters)
        else:
            try:
                rows = self._inline_transaction(compiled, parameters)
            except OperationalError as exc:
                if not _busy(exc):
                    raise
                # rolled back: made again on the thread, which waits for the lock
                rows = await self._on_thread(_on_engine, self._engine, compiled, parameters)
        self._since_checkpoint += 1
        if self._since_checkpoint >= CHECKPOINT_EVERY:
            self._since_checkpoint = 0
            await self._on_thread(self._checkpoint)
            self._restarting = True
        return rows

    def _inline_transaction(
        self, compiled: _Compiled, parameters: Mapping[str, Any]
    ) -> list[tuple[Any, ...]]:
        """:func:`_transaction` on the loop's own connection (opened on first use). One
        left inside its transaction, its rollback failed too, is closed (which ends the
        transaction and frees the lock) and opened afresh by the next statement."""
        if self._inline_raw is None:
            self._inline_raw = _connect(self._inline)
        raw = self._inline_raw
        try:
            return _transaction(raw.driver_connection, compiled, parameters)
        finally:
            if raw.driver_connection is not None and raw.driver_connection.in_transaction:
                self._inline_raw = None
                raw.invalidate()

    async def _on_thread(self, call: Callable[..., T], *args: Any) -> T:
        """``call(*args)`` on the statement thread. A caller cancelled meanwhile still
        waits for it to end (it holds the store's writer lock until then), then is
        cancelled."""
        done = asyncio.get_running_loop().run_in_executor(self._thread, call, *args)
        try:
            return await asyncio.shield(done)
        except asyncio.CancelledError:
            while not done.done():  # however often it is cancelled meanwhile
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait({done})
            raise

    def _checkpoint(self) -> None:
        try:
            raw = self._engine.raw_connection()  # no transaction: a checkpoint is outside one
            try:
                raw.driver_connection.execute("PRAGMA wal_checkpoint(PASSIVE)")  # type: ignore[union-attr]
            finally:
                raw.close()
        except Exception:  # the next one, or another connection's, will do
            log.warning("checkpointing SQLite's write-ahead log failed", exc_info=True)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._inline_raw is not None:
            self._inline_raw.close()
        self._inline.dispose()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._thread, self._engine.dispose)  # on its own thread
        self._thread.shutdown(wait=True)


@dataclass(frozen=True, slots=True)
class _Compiled:
    """A statement as the sqlite3 module takes it: its SQL, with ``?`` for each
    parameter in ``names``' order, the values the statement holds itself (``bound``:
    those of a ``.values(...)``), and the conversion each typed parameter's type asks
    for (``convert``), as SQLAlchemy's execution would make them."""

    sql: str
    names: tuple[str, ...]
    bound: Mapping[str, Any]
    convert: Mapping[str, Callable[[Any], Any]]

    def values(self, parameters: Mapping[str, Any]) -> list[Any]:
        given = {**self.bound, **parameters}
        convert = self.convert
        return [
            convert[name](given[name]) if name in convert else given[name] for name in self.names
        ]


@lru_cache(maxsize=64)
def _compiled(statement: ClauseElement, dialect: Dialect) -> _Compiled:
    """``statement`` compiled once (the ones run here are module-level constants, a
    submit's; one made for each call is compiled for each call). Its values are those
    it holds (``.values(...)``) and the parameters given by name: a Python-side column
    default, a parameter whose value is a callable and an expanding ``IN`` are refused,
    as nothing here would compute them."""
    compiled: Any = statement.compile(dialect=dialect)
    if compiled.literal_execute_params or compiled.post_compile_params:
        raise ValueError("a one-statement write takes no expanding (IN) parameters")
    if compiled.insert_prefetch or compiled.update_prefetch:
        raise ValueError("a one-statement write runs no Python-side column defaults")
    if any(bind.callable is not None for bind in compiled.binds.values()):
        raise ValueError("a one-statement write takes no parameter computed by a callable")
    return _Compiled(
        compiled.string,
        tuple(compiled.positiontup or ()),
        {name: bind.effective_value for name, bind in compiled.binds.items() if not bind.required},
        dict(compiled._bind_processors),  # what SQLAlchemy's own execution applies
    )


def _transaction(
    db: Any, compiled: _Compiled, parameters: Mapping[str, Any]
) -> list[tuple[Any, ...]]:
    """``compiled`` with ``parameters``, a write transaction of its own on the sqlite3
    connection ``db`` (which opens none itself: see ``_sqlite_setup``). A parameter
    missing, or refused by its type, is raised as SQLAlchemy's ``StatementError``, the
    database's errors as its ``DBAPIError`` kinds; after any error the transaction is
    rolled back (a failed rollback leaves the first error the one raised)."""
    try:
        values = compiled.values(parameters)
    except Exception as exc:
        raise StatementError(
            f"a parameter is missing or refused: {exc!r}", compiled.sql, dict(parameters), exc
        ) from exc
    try:
        db.execute("BEGIN IMMEDIATE")
        try:
            rows: list[tuple[Any, ...]] = db.execute(compiled.sql, values).fetchall()
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
            raise
    except sqlite3.Error as exc:
        raise DBAPIError.instance(compiled.sql, values, exc, sqlite3.Error, dialect=None) from exc
    return rows


def _on_engine(
    engine: Engine, compiled: _Compiled, parameters: Mapping[str, Any]
) -> list[tuple[Any, ...]]:
    """:func:`_transaction` on ``engine``'s one connection (on the thread it was made on)."""
    raw = _connect(engine)
    try:
        return _transaction(raw.driver_connection, compiled, parameters)
    finally:
        raw.close()


def _connect(engine: Engine) -> PoolProxiedConnection:
    """``engine``'s connection; a failure to open it raised as SQLAlchemy's, as a
    statement's would be (``OperationalError``: the store is down, or busy)."""
    try:
        return engine.raw_connection()
    except sqlite3.Error as exc:
        raise DBAPIError.instance(None, None, exc, sqlite3.Error) from exc


def _busy(exc: OperationalError) -> bool:
    """Another connection holds the write lock (SQLITE_BUSY, under any extended code)."""
    code = getattr(exc.orig, "sqlite_errorcode", None)
    return code is not None and code & 0xFF == sqlite3.SQLITE_BUSY
