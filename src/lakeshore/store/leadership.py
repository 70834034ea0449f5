"""Which server runs the elasticity controller, and for which queues.

With SQLite the store is one server's own, so that server leads. With PostgreSQL several
replicas may share the store and exactly one may tick the unpinned queues: the one holding
a session-level advisory lock. Queues pinned to a node (``serverNodeId``) are ticked by the
server started with that node id, whether it leads or not, under a second advisory lock
keyed by the node id (so two servers given the same node id never both tick them). A
lock lives as long as its connection, so a server that dies (or loses its connection)
frees it at once, and another takes over on its next attempt, within one interval.

A server whose machine vanishes (power, network) sends no goodbye: its connection, and
the lock, would outlive it until the kernel's keep-alive gave up (two hours by default).
The lock's connection therefore asks the database to probe its peer every few seconds
and to drop it once unanswered for :data:`DEAD_PEER_S` (``tcp_keepalives_*`` and
``tcp_user_timeout``, per session), and probes the database the same way from its side,
so that both ends learn of a dead peer in seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from dataclasses import dataclass
from typing import Final, Protocol

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from sqlalchemy.engine import URL

from lakeshore.store.driver import conninfo

log = logging.getLogger("lakeshore.leadership")

LOCK_KEY: Final = 0x1A4E5_0002  # pg_advisory_lock key of the controller
# the key of the cluster's housekeeping (the schedules' slots, the retention sweep): any
# server takes it, elasticity on or off, apart from the controller's, which only a server
# running the controller's loop may hold (a replica that serves the API only must not
# keep the controller from the others)
HOUSEKEEPING_KEY: Final = 0x1A4E5_0003
DEAD_PEER_S: Final = 15  # a silent peer of the lock's connection is dropped after this

# keep-alive probes after 5 s idle, every 2 s, 5 unanswered: the peer is dead by ~15 s
_KEEPALIVE: Final = {"idle": 5, "interval": 2, "count": 5}
_SERVER_SIDE: Final = " ".join(
    [f"-c tcp_keepalives_{name}={value}" for name, value in _KEEPALIVE.items()]
    + [f"-c tcp_user_timeout={DEAD_PEER_S * 1000}"]
)
_CLIENT_SIDE: Final = {"keepalives": 1, **{f"keepalives_{k}": v for k, v in _KEEPALIVE.items()}}


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


class Duty(Protocol):
    """One duty of the cluster that one server does at a time (:data:`HOUSEKEEPING_KEY`)."""

    async def try_lead(self) -> bool: ...

    @property
    def leading(self) -> bool:
        """Whether this server held it at its last :meth:`try_lead`."""
        ...

    async def release(self) -> None: ...


class Always:
    """The duty of the only server there is (SQLite)."""

    async def try_lead(self) -> bool:
        return True

    @property
    def leading(self) -> bool:
        return True

    async def release(self) -> None:
        return None


def housekeeping(url: URL) -> Duty:
    """The cluster's housekeeping (schedules, retention): an advisory lock of its own on
    PostgreSQL, always this server's on SQLite."""
    if url.get_backend_name() != "postgresql":
        return Always()
    return AdvisoryLock(url, HOUSEKEEPING_KEY, "the schedules and the retention sweep")


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
        given = conninfo(url)
        options = conninfo_to_dict(given).get("options")  # the operator's own, kept
        self._conninfo = make_conninfo(
            given,
            options=f"{options} {_SERVER_SIDE}" if options else _SERVER_SIDE,
            tcp_user_timeout=DEAD_PEER_S * 1000,
            **_CLIENT_SIDE,
        )
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
        except asyncio.CancelledError:  # the server is stopping: no connection left open
            await conn.close()
            raise
        if row is None or not row[0]:
            await conn.close()
            return False
        log.info("this server now ticks %s", self.what)
        self._conn = conn
        return True

    async def _drop(self, *, unlock: bool = False) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error, OSError):
                if unlock:  # before the close, whose backend frees the lock only as it exits
                    await conn.execute("SELECT pg_advisory_unlock(%s)", (self.key,))
                await conn.close()

    async def release(self) -> None:
        """Let go of the lock, at once: the next replica to try takes it."""
        async with self._lock:
            await self._drop(unlock=True)
