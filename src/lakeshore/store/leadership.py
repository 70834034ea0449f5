"""Which server runs the elasticity controller, and for which queues.

With SQLite the store is one server's own, so that server leads. With PostgreSQL several
replicas may share the store and exactly one may tick the unpinned queues: the one holding
a session-level advisory lock. Queues pinned to a node (``serverNodeId``) are ticked by the
server started with that node id, whether it leads or not, under a second advisory lock
keyed by the node id (so two servers given the same node id never both tick them). A
lock lives as long as its connection, so a server that dies (or loses its connection)
frees it at once, and another takes over on its next attempt, within one interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from dataclasses import dataclass
from typing import Final, Protocol

import psycopg
from sqlalchemy.engine import URL

from lakeshore.store.driver import conninfo

log = logging.getLogger("lakeshore.leadership")

LOCK_KEY: Final = 0x1A4E5_0002  # pg_advisory_lock key of the controller


def node_lock_key(node_id: str) -> int:
    """The advisory-lock key of the queues pinned to ``node_id`` (a signed 64-bit hash)."""
    digest = hashlib.blake2b(f"lakeshore-node:{node_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


@dataclass(frozen=True)
class Led:
    """What this server may tick now: the unpinned queues (it leads the cluster), and the
    queues pinned to its own node id."""

    unpinned: bool
    pinned: bool

    @property
    def anything(self) -> bool:
        return self.unpinned or self.pinned


class Leadership(Protocol):
    async def try_lead(self) -> Led: ...

    @property
    def leads_cluster(self) -> bool:
        """Whether this server leads the unpinned queues now (it exports the store's
        gauges: see ``lakeshore.services.metrics``)."""
        ...

    async def release(self) -> None: ...


class Solo:
    """The only server there is (SQLite): it ticks every queue it may."""

    async def try_lead(self) -> Led:
        return Led(unpinned=True, pinned=True)

    @property
    def leads_cluster(self) -> bool:
        return True

    async def release(self) -> None:
        return None


class Replicas:
    """Several servers on one PostgreSQL: the cluster lock for unpinned queues, and the
    node's own lock for the queues pinned to it (when the server has a node id)."""

    def __init__(self, url: URL, node_id: str | None) -> None:
        self.cluster = AdvisoryLock(url)
        self.node = (
            AdvisoryLock(url, node_lock_key(node_id), f'the queues pinned to node "{node_id}"')
            if node_id
            else None
        )

    @property
    def leads_cluster(self) -> bool:
        return self.cluster.leading

    async def try_lead(self) -> Led:
        unpinned = await self.cluster.try_lead()
        pinned = await self.node.try_lead() if self.node is not None else False
        return Led(unpinned=unpinned, pinned=pinned)

    async def release(self) -> None:
        await self.cluster.release()
        if self.node is not None:
            await self.node.release()


class AdvisoryLock:
    """Leadership by ``pg_try_advisory_lock`` on a connection kept for the purpose."""

    def __init__(self, url: URL, key: int = LOCK_KEY, what: str = "the unpinned queues") -> None:
        self.key = key
        self.what = what
        self._conninfo = conninfo(url)
        self._conn: psycopg.AsyncConnection[tuple[object, ...]] | None = None
        self._lock = asyncio.Lock()

    @property
    def leading(self) -> bool:
        return self._conn is not None

    async def try_lead(self) -> bool:
        """Whether this server holds the lock (taking it if it is free)."""
        async with self._lock:
            if self._conn is not None:
                try:
                    await self._conn.execute("SELECT 1")
                    return True
                except (psycopg.Error, OSError) as exc:
                    log.warning("lost the controller lock for %s (%s)", self.what, exc)
                    await self._drop()
            return await self._acquire()

    async def _acquire(self) -> bool:
        try:
            conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
        except (psycopg.Error, OSError) as exc:
            log.warning("cannot reach the store to tick %s: %s", self.what, exc)
            return False
        try:
            cursor = await conn.execute("SELECT pg_try_advisory_lock(%s)", (self.key,))
            row = await cursor.fetchone()
        except (psycopg.Error, OSError):
            await conn.close()
            return False
        if row is None or not row[0]:
            await conn.close()
            return False
        log.info("this server now ticks %s", self.what)
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
