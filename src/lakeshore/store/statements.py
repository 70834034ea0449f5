"""PostgreSQL connections for one-statement writes, held outside SQLAlchemy's pool.

A single submit is one autocommit statement on psycopg's own connection (see
:meth:`lakeshore.store.engine.Store.statement`). Taken from SQLAlchemy's async pool, the
connection cost more CPU than the statement: a greenlet for the checkout, one to switch
the connection to autocommit and one to switch it back at checkin, and a frame stack
mapped and unmapped for each greenlet (measured: 0.26 ms against 0.09 ms for the same
``SELECT 1`` on a connection kept here). These connections are opened in autocommit and
stay so; nothing else uses them.

psycopg_pool was not taken for this: when the database is down, its checkout waits for
its background workers to reconnect until its time-out, where a submit should be
refused at once (503) as every other request is. Here a checkout takes the most recently
used idle connection, looked at without a round trip (:func:`~.liveness.unsure`) and
pinged only when it sat idle past :data:`~.liveness.PING_IDLE_S` or its socket turned
readable (a server's last words), or opens a new one (a refusal then raises at once). At
most ``size`` are out at a time, and a checkout waits up to ``wait_s`` for one. A
connection comes back only if it is usable and idle (not mid-statement: a request
cancelled during its statement leaves it busy, so it is closed instead).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg import AsyncConnection as PsycopgConnection
from psycopg.errors import ConnectionTimeout
from psycopg.pq import TransactionStatus

from lakeshore.store.liveness import PING_IDLE_S, unsure


class StatementConnections:
    def __init__(self, conninfo: str, size: int, wait_s: float) -> None:
        self._conninfo = conninfo
        self._wait_s = wait_s
        self._room = asyncio.Semaphore(size)
        self._idle: list[tuple[PsycopgConnection[Any], float]] = []  # newest last
        self._closed = False

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[PsycopgConnection[Any]]:
        """An autocommit connection, for one statement; psycopg's errors propagate, and
        :class:`~psycopg.errors.ConnectionTimeout` when none is free within ``wait_s``."""
        try:
            async with asyncio.timeout(self._wait_s):
                await self._room.acquire()
        except TimeoutError:
            raise ConnectionTimeout(
                f"no database connection was free for a statement within {self._wait_s:.0f} s"
            ) from None
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
                await conn.execute("SELECT 1")
                return conn
            except psycopg.Error:
                await _discard(conn)
        return await connect(self._conninfo)

    async def _give(self, conn: PsycopgConnection[Any]) -> None:
        if (
            self._closed
            or conn.closed
            or conn.broken
            or conn.info.transaction_status != TransactionStatus.IDLE
        ):
            await _discard(conn)
            return
        self._idle.append((conn, time.monotonic()))


async def connect(conninfo: str) -> PsycopgConnection[Any]:
    return await PsycopgConnection.connect(conninfo, autocommit=True)


async def _discard(conn: PsycopgConnection[Any]) -> None:
    """Close, even while the task is being cancelled (the close itself is not cut)."""
    with contextlib.suppress(psycopg.Error):
        await asyncio.shield(conn.close())
