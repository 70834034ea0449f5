"""Wake-ups across replicas: a commit's NOTIFY reaches another process's LISTEN."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import text

from lakeshore.domain.ids import new_id
from lakeshore.domain.queue import parse_spec
from lakeshore.store import invocations as inv_store
from lakeshore.store import namespaces as ns_store
from lakeshore.store import queues as queue_store
from lakeshore.store import wakeups
from lakeshore.store import workers as worker_store
from lakeshore.store.engine import Store, create_engine_for, migrate, parse_url


class Heard:
    def __init__(self) -> None:
        self.keys: list[str] = []
        self.everyone = 0
        self.deliveries = 0
        self.changed = asyncio.Event()

    def deliver(self, keys: list[str]) -> None:
        self.keys.extend(keys)
        self.deliveries += 1
        self.changed.set()

    def deliver_all(self) -> None:
        self.everyone += 1

    async def until(self, count: int) -> None:
        for _ in range(200):
            if len(self.keys) >= count:
                return
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), timeout=0.05)
        raise AssertionError(f"heard {self.keys}, wanted {count} keys")


@contextlib.asynccontextmanager
async def listening(
    url: Any,
    deliver: Callable[[list[str]], None] = lambda _: None,
    deliver_all: Callable[[], None] = lambda: None,
    **options: Any,
) -> AsyncIterator[None]:
    """``wakeups.listen`` running for the block, which starts once it is listening."""
    connected = asyncio.Event()
    listener = asyncio.create_task(
        wakeups.listen(url, deliver, deliver_all, connected=connected, **options)
    )
    try:
        await asyncio.wait_for(connected.wait(), timeout=10)
        yield
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener


@pytest.fixture
def listener_connections(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, dict[str, str]]]:
    """Each listener connection as it starts to listen: its socket, its parameters."""
    seen: list[tuple[int, dict[str, str]]] = []
    heard = wakeups._heard

    async def noting(conn: Any, deliver: Any) -> None:
        seen.append((conn.pgconn.socket, conn.info.get_parameters()))
        await heard(conn, deliver)

    monkeypatch.setattr(wakeups, "_heard", noting)
    return seen


async def test_committed_keys_reach_a_listener_and_rolled_back_ones_do_not(
    fresh_pg_url: str,
) -> None:
    url = parse_url(fresh_pg_url)
    heard = Heard()
    connected = asyncio.Event()
    listener = asyncio.create_task(
        wakeups.listen(url, heard.deliver, heard.deliver_all, connected=connected)
    )
    store = Store(create_engine_for(url))
    try:
        await asyncio.wait_for(connected.wait(), timeout=10)
        assert heard.everyone == 1  # woken once on connect: nothing heard before it counts
        with contextlib.suppress(RuntimeError):
            async with store.write() as conn:
                await wakeups.publish(conn, ["q_rolled_back"])
                raise RuntimeError("roll back")
        async with store.write() as conn:
            await wakeups.publish(conn, ["q_1", "stream:inv_1", "q_1"])
        await heard.until(2)
        assert sorted(heard.keys) == ["q_1", "stream:inv_1"]
        many = [f"stream:inv_{n:06d}" for n in range(1000)]  # a big batch's outcomes
        async with store.write() as conn:
            await wakeups.publish(conn, many)
        await heard.until(2 + len(many))
        assert sorted(heard.keys[2:]) == many
        packed = wakeups.payloads(many)
        assert 1 < len(packed) < 10 and all(len(p.encode()) < 8000 for p in packed)
        assert heard.deliveries == 1 + len(packed)  # one notification holds many keys
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
        await store.close()


async def test_a_listener_reconnects_and_wakes_everyone_after_a_drop(fresh_pg_url: str) -> None:
    url = parse_url(fresh_pg_url)
    heard = Heard()
    connected = asyncio.Event()
    listener = asyncio.create_task(
        wakeups.listen(url, heard.deliver, heard.deliver_all, retry_s=0.05, connected=connected)
    )
    store = Store(create_engine_for(url))
    try:
        await asyncio.wait_for(connected.wait(), timeout=10)
        async with store.write() as conn:  # cut the listener's connection from the server side
            await conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                    "AND query ILIKE 'LISTEN%'"
                )
            )
        for _ in range(200):
            if heard.everyone >= 2 and connected.is_set():
                break
            await asyncio.sleep(0.05)
        assert heard.everyone >= 2
        async with store.write() as conn:
            await wakeups.publish(conn, ["q_after"])
        await heard.until(1)
        assert heard.keys == ["q_after"]
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
        await store.close()


async def test_publishing_on_sqlite_is_a_no_op(tmp_path: Path) -> None:
    store = Store(create_engine_for(parse_url(f"sqlite:///{tmp_path}/w.db")))
    try:
        async with store.write() as conn:
            await wakeups.publish(conn, ["q_1"])  # no NOTIFY on SQLite, and no error
            assert (await conn.execute(text("SELECT 1"))).scalar_one() == 1
    finally:
        await store.close()


def _submitted(queue_id: str, key: str | None, now: datetime) -> dict[str, Any]:
    return {
        "id": new_id("inv"),
        "namespace_id": "ns_1",
        "queue_id": queue_id,
        "queue_name": queue_id,
        "fn": "pkg:fn",
        "args": [],
        "kwargs": {},
        "priority": 0.0,
        "key": key,
        "state": "pending",
        "attempts": 0,
        "max_attempts": 3,
        "retry": None,
        "concurrency_key": None,
        "timeout_s": None,
        "available_at": now,
        "created_at": now,
    }


async def test_a_submit_wakes_its_queue_once_and_a_repeated_key_wakes_nobody(
    fresh_pg_url: str,
) -> None:
    url = parse_url(fresh_pg_url)
    migrate(url)
    heard = Heard()
    store = Store(create_engine_for(url))
    now = datetime(2026, 1, 1, tzinfo=UTC)
    try:
        async with listening(url, heard.deliver, heard.deliver_all):
            async with store.write() as conn:
                await ns_store.insert_namespace(conn, id="ns_1", name="n", now=now)
                for name in ("q_a", "q_b"):
                    spec = parse_spec({"name": name.replace("_", "-")})
                    await queue_store.insert_queue(
                        conn, id=name, namespace_id="ns_1", spec=spec, now=now
                    )
            async with store.write() as conn:  # three rows, one wake-up
                await inv_store.insert_many(conn, [_submitted("q_a", None, now) for _ in range(3)])
            async with store.write() as conn:
                await inv_store.insert_many(conn, [_submitted("q_b", "k", now)])
            async with store.write() as conn:  # the key is taken: nothing new to wake for
                await inv_store.insert_many(conn, [_submitted("q_b", "k", now)])
            async with store.write() as conn:  # a marker, so the wait has an end
                await wakeups.publish(conn, ["marker"])
            await heard.until(3)
        assert heard.keys == ["q_a", "q_b", "marker"]
    finally:
        await store.close()


async def test_a_submit_handed_to_a_waiting_worker_wakes_nobody_and_a_pending_one_does(
    fresh_pg_url: str,
) -> None:
    """A row that goes in leased to a waiting claim is no other claim's to take; one
    that goes in pending, because the worker may not take it, wakes its queue."""
    url = parse_url(fresh_pg_url)
    migrate(url)
    heard = Heard()
    store = Store(create_engine_for(url))
    now = datetime(2026, 1, 1, tzinfo=UTC)
    try:
        async with listening(url, heard.deliver, heard.deliver_all):
            async with store.write() as conn:
                await ns_store.insert_namespace(conn, id="ns_1", name="n", now=now)
                spec = parse_spec({"name": "q-a"})
                await queue_store.insert_queue(
                    conn, id="q_a", namespace_id="ns_1", spec=spec, now=now
                )
                worker = {
                    "id": "wk_1",
                    "namespace_id": "ns_1",
                    "name": "w1",
                    "runners": ["process"],
                    "tags": {},
                    "capabilities": {},
                    "max_invocations": 1,
                }
                await worker_store.upsert(conn, values=worker, queue_ids=["q_a"], now=now)
            handed = {"worker_id": "wk_1", "holds": 1, "lease_s": 30.0}
            async with store.statement() as raw:
                first = await inv_store.insert_one_handed(
                    raw, _submitted("q_a", None, now), 0, **handed
                )
            async with store.statement() as raw:  # the worker holds one: this one waits
                second = await inv_store.insert_one_handed(
                    raw, _submitted("q_a", None, now), 0, **handed
                )
            assert first is not None and first["state"] == "running"
            assert second is not None and second["state"] == "pending"
            async with store.write() as conn:  # a marker, so the wait has an end
                await wakeups.publish(conn, ["marker"])
            await heard.until(2)
        assert heard.keys == ["q_a", "marker"]
    finally:
        await store.close()


async def test_a_dropped_listener_lets_go_of_its_socket_at_once(
    fresh_pg_url: str, listener_connections: list[tuple[int, dict[str, str]]]
) -> None:
    """libpq closes a broken connection's socket inside the listener's read: from then on
    the descriptor's number is free, and the next socket opened in the process may get
    it. The listener's reader must be gone by then, or its clean-up would take away the
    new socket's reader."""
    loop = asyncio.get_running_loop()
    taken = asyncio.Event()
    fired = asyncio.Event()
    sockets: list[socket.socket] = []
    try:
        async with listening(parse_url(fresh_pg_url), retry_s=30):
            [(fd, _)] = listener_connections

            def watch() -> None:  # at every turn of the loop, until the number is free
                try:
                    os.fstat(fd)
                except OSError:
                    other = socket.socket()  # the lowest free number: likely the same
                    if other.fileno() != fd:  # if not, moved onto it
                        os.dup2(other.fileno(), fd)
                        other.close()
                        other = socket.socket(fileno=fd)
                    sockets.append(other)
                    loop.add_reader(fd, fired.set)
                    taken.set()
                    return
                loop.call_soon(watch)

            loop.call_soon(watch)
            with psycopg.connect(fresh_pg_url, autocommit=True) as admin:
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                    "AND query ILIKE 'LISTEN%'"
                )
            await asyncio.wait_for(taken.wait(), timeout=10)
            with socket.socket() as server:  # make the new socket readable
                server.bind(("127.0.0.1", 0))
                server.listen()
                sockets[0].connect(server.getsockname())
                accepted, _ = server.accept()
                with accepted:
                    accepted.sendall(b"x")
                    await asyncio.wait_for(fired.wait(), timeout=10)
    finally:
        for sock in sockets:
            loop.remove_reader(sock.fileno())
            sock.close()


async def test_the_listener_finds_a_silent_server_gone_by_tcp_keepalives(
    fresh_pg_url: str, listener_connections: list[tuple[int, dict[str, str]]]
) -> None:
    """It only ever reads, so nothing else would notice a server that stopped answering
    without closing the connection; a URL's own keepalive settings stand."""
    for url, idle in ((fresh_pg_url, "30"), (f"{fresh_pg_url}?keepalives_idle=7", "7")):
        async with listening(parse_url(url)):
            pass
        _, parameters = listener_connections[-1]
        assert parameters["keepalives"] == "1"
        assert parameters["keepalives_idle"] == idle
        assert (parameters["keepalives_interval"], parameters["keepalives_count"]) == ("10", "3")
