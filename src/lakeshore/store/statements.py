"""One statement that is its own transaction: the interface, and PostgreSQL's side of it.

A single submit is one write statement, and the store runs it the fastest way each
database allows. Callers hold a :class:`Statements` (``async with store.statement()``:
:meth:`lakeshore.store.engine.Store.statement`) and run a :class:`OneStatement` with
:meth:`Statements.fetch`, without knowing which store is underneath; each
:class:`OneStatement` carries both stores' SQL (and, where they take their parameters
differently, how each makes its own from the caller's), so the rule it states is
written once and the choice of SQL is the implementation's. Two implement it:
:class:`PostgresqlStatements` here, and :class:`~.sqlite_statements.SqliteStatements`.

On PostgreSQL a statement runs on psycopg's own connection, in autocommit, prepared
once per connection and run on libpq directly (:mod:`.prepared`). Taken from
SQLAlchemy's async pool, the connection cost more CPU than the statement: a greenlet
for the checkout, one to switch the connection to autocommit and one to switch it back
at checkin, and a frame stack mapped and unmapped for each greenlet (measured: 0.26 ms
against 0.09 ms for the same ``SELECT 1`` on a connection kept here). These connections
are opened in autocommit and stay so; nothing else uses them.

psycopg_pool was not taken for this: when the database is down, its checkout waits for
its background workers to reconnect until its time-out, where a submit should be
refused at once (503) as every other request is. Here a checkout takes the most recently
used idle connection, looked at without a round trip (:func:`~.liveness.unsure`) and
pinged only when it sat idle past :data:`~.liveness.PING_IDLE_S` or its socket turned
readable (a server's last words), or opens a new one (a refusal then raises at once). At
most ``size`` are out at a time, and a checkout waits up to ``wait_s`` for one. A
connection comes back only if it is usable and idle (not mid-statement: a request
cancelled during its statement leaves it busy, so the server is asked to cancel the
statement and the connection is closed instead). Its connection errors are raised as
SQLAlchemy's, as every other store call's are.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import psycopg
from psycopg import AsyncConnection as PsycopgConnection
from psycopg.errors import ConnectionTimeout
from psycopg.pq import TransactionStatus
from sqlalchemy.exc import InterfaceError, OperationalError

from lakeshore.store import prepared
from lakeshore.store.driver import psycopg_text
from lakeshore.store.liveness import PING_IDLE_S, unsure

Parameters = Mapping[str, Any]


@dataclass(frozen=True, eq=False)
class OneStatement:
    """A write that is a transaction of its own, as each store spells it: ``postgresql``
    and ``sqlite`` are SQLAlchemy statements (a module-level constant: each is compiled
    once, and prepared on PostgreSQL under ``name``). Both take the caller's parameters
    by name and ignore the ones they do not name; where a store takes one in a form of
    its own (a JSON document of rows, times as SQLite's column keeps them), its
    ``for_postgresql`` or ``for_sqlite`` makes them from the caller's."""

    name: str
    postgresql: Any
    sqlite: Any
    for_postgresql: Callable[[Parameters], Parameters] | None = None
    for_sqlite: Callable[[Parameters], Parameters] | None = None


class Statements(Protocol):
    """What ``store.statement()`` hands out: one statement at a time, each its own
    transaction."""

    async def fetch(
        self, statement: OneStatement, parameters: Parameters
    ) -> Sequence[tuple[Any, ...]]:
        """Run ``statement`` with ``parameters``, committed: the rows it returned. A
        text column reads the same on both stores; other values come as the store
        keeps them (text on PostgreSQL). A lost or refused connection is raised as
        SQLAlchemy's ``OperationalError``; the database's refusal of the statement as
        the driver's error (``psycopg.Error``, SQLAlchemy's ``DBAPIError`` kinds)."""
        ...


class StatementPool(Protocol):
    """Where a store's :class:`Statements` come from."""

    def checkout(self) -> AbstractAsyncContextManager[Statements]: ...

    async def close(self) -> None: ...


class PostgresqlStatements:
    """Statements on one of the store's statement connections (``connection``, psycopg's,
    in autocommit, this caller's alone while it is held), prepared and run on libpq."""

    __slots__ = ("connection",)

    def __init__(self, connection: PsycopgConnection[Any]) -> None:
        self.connection = connection

    def fetch(
        self, statement: OneStatement, parameters: Parameters
    ) -> Coroutine[Any, Any, list[tuple[str | None, ...]]]:
        # not a coroutine of its own: a submit awaits libpq's run with no frame between
        if statement.for_postgresql is not None:
            parameters = statement.for_postgresql(parameters)
        return prepared.fetch(self.connection, _prepared(statement), parameters)


@functools.cache
def _prepared(statement: OneStatement) -> prepared.Prepared:
    text, fixed = psycopg_text(statement.postgresql)
    if fixed:  # nothing here would send them
        raise ValueError(f"statement {statement.name!r} holds values of its own: bind them")
    return prepared.Prepared.of(statement.name, text)


CONNECT_S = 10.0  # a new connection, as SQLAlchemy's pool would wait for one
PING_S = 5.0  # a ping of a connection that sat idle or turned readable


class StatementConnections:
    """PostgreSQL's :class:`StatementPool`: up to ``size`` connections of its own (see
    above), each handed out as :class:`PostgresqlStatements`."""

    def __init__(self, conninfo: str, size: int, wait_s: float) -> None:
        self._conninfo = conninfo
        self._wait_s = wait_s
        self._room = asyncio.Semaphore(size)
        self._idle: list[tuple[PsycopgConnection[Any], float]] = []  # newest last
        self._closed = False

    @asynccontextmanager
    async def checkout(self) -> AsyncIterator[PostgresqlStatements]:
        """Statements on an autocommit connection of this pool's. A connection error
        (:class:`~psycopg.errors.ConnectionTimeout` when none is free within ``wait_s``)
        is raised as SQLAlchemy's ``OperationalError`` (or ``InterfaceError``), whether
        it came at the checkout or in a statement."""
        try:
            async with self._connection() as conn:
                yield PostgresqlStatements(conn)
        except psycopg.OperationalError as exc:
            raise OperationalError(None, None, exc) from exc
        except psycopg.InterfaceError as exc:
            raise InterfaceError(None, None, exc) from exc

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[PsycopgConnection[Any]]:
        if self._room.locked():  # all out: wait for one, up to wait_s
            try:
                async with asyncio.timeout(self._wait_s):
                    await self._room.acquire()
            except TimeoutError:
                raise ConnectionTimeout(
                    f"no database connection was free for a statement within {self._wait_s:.0f} s"
                ) from None
        else:  # one is free: taken without waiting, so without a timer to set and cancel
            await self._room.acquire()
        try:
            conn = await self._take()
            try:
                yield conn
            finally:
                await self._give(conn)
        finally:
            self._room.release()

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn, _ in idle:
            with contextlib.suppress(psycopg.Error):
                await conn.close()

    async def _take(self) -> PsycopgConnection[Any]:
        while self._idle:
            conn, since = self._idle.pop()
            if not unsure(conn) and time.monotonic() - since <= PING_IDLE_S:
                return conn
            try:
                async with asyncio.timeout(PING_S):
                    await conn.execute("SELECT 1")
                return conn
            except (psycopg.Error, TimeoutError):
                await _discard(conn)
            except BaseException:  # cancelled while pinging: not handed back unsure
                await _discard(conn)
                raise
        return await connect(self._conninfo)

    async def _give(self, conn: PsycopgConnection[Any]) -> None:
        status = conn.info.transaction_status
        if self._closed or conn.closed or conn.broken or status != TransactionStatus.IDLE:
            try:
                if status == TransactionStatus.ACTIVE:  # left mid-statement: stopped there too
                    await _cancel(conn)
            finally:
                await _discard(conn)
            return
        self._idle.append((conn, time.monotonic()))


async def connect(conninfo: str) -> PsycopgConnection[Any]:
    """A new connection; a server that does not answer is given up on after
    :data:`CONNECT_S` (psycopg's own default waits over two minutes)."""
    return await PsycopgConnection.connect(
        conninfo, autocommit=True, connect_timeout=int(CONNECT_S)
    )


CANCEL_S = 2.0  # the longest a statement left running is waited on to be cancelled


async def _cancel(conn: PsycopgConnection[Any]) -> None:
    """Have the server cancel the statement ``conn`` is running (a request cancelled
    while it waited for it): closing the connection alone would leave it running, and
    perhaps committing, in a backend that outlives the connection until it ends."""
    with contextlib.suppress(psycopg.Error):
        await asyncio.shield(conn.cancel_safe(timeout=CANCEL_S))


async def _discard(conn: PsycopgConnection[Any]) -> None:
    """Close, even while the task is being cancelled (the close itself is not cut)."""
    with contextlib.suppress(psycopg.Error):
        await asyncio.shield(conn.close())
