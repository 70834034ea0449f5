"""Which server runs the elasticity controller.

With SQLite the store is one server's own, so that server leads. With PostgreSQL several
replicas may share the store and exactly one may tick: the one holding a session-level
advisory lock. The lock lives as long as the leader's connection, so a leader that dies
(or loses its connection) frees it at once, and another replica takes over on its next
attempt, within one interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final, Protocol

import psycopg
from sqlalchemy.engine import URL

log = logging.getLogger("lakeshore.leadership")

LOCK_KEY: Final = 0x1A4E5_0002  # pg_advisory_lock key of the controller


class Leadership(Protocol):
    async def try_lead(self) -> bool: ...

    async def release(self) -> None: ...


class Solo:
    """The only server there is (SQLite)."""

    async def try_lead(self) -> bool:
        return True

    async def release(self) -> None:
        return None


class AdvisoryLock:
    """Leadership by ``pg_try_advisory_lock`` on a connection kept for the purpose."""

    def __init__(self, url: URL) -> None:
        self._conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
        self._conn: psycopg.AsyncConnection[tuple[object, ...]] | None = None
        self._lock = asyncio.Lock()

    @property
    def leading(self) -> bool:
        return self._conn is not None

    async def try_lead(self) -> bool:
        async with self._lock:
            if self._conn is not None:
                try:
                    await self._conn.execute("SELECT 1")
                    return True
                except (psycopg.Error, OSError) as exc:
                    log.warning("lost the controller lease (%s)", exc)
                    await self._drop()
            return await self._acquire()

    async def _acquire(self) -> bool:
        try:
            conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
        except (psycopg.Error, OSError) as exc:
            log.warning("cannot reach the store to lead the controller: %s", exc)
            return False
        try:
            cursor = await conn.execute("SELECT pg_try_advisory_lock(%s)", (LOCK_KEY,))
            row = await cursor.fetchone()
        except (psycopg.Error, OSError):
            await conn.close()
            return False
        if row is None or not row[0]:
            await conn.close()
            return False
        log.info("this server now runs the elasticity controller")
        self._conn = conn
        return True

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error, OSError):
                await conn.close()

    async def release(self) -> None:
        async with self._lock:
            await self._drop()
