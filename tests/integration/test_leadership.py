"""Who ticks what with several servers on one PostgreSQL: one leader for the unpinned
queues, and each node for the queues pinned to it (``serverNodeId``)."""

from __future__ import annotations

import httpx
import pytest

from lakeshore.services.fleet.controller import Controller
from lakeshore.store.engine import Store, parse_url
from lakeshore.store.leadership import DEAD_PEER_S, AdvisoryLock, Led, Replicas
from tests.conftest import FakeClock, _truncate
from tests.integration.test_controller import TICK, elastic, queue


@pytest.fixture
def database_url(pg_database: str) -> str:
    """PostgreSQL only: leadership is an advisory lock there (SQLite has one server)."""
    _truncate(pg_database)
    return pg_database


async def test_one_leader_for_unpinned_queues_and_each_node_for_its_own(
    api: httpx.AsyncClient, store: Store, clock: FakeClock, database_url: str
) -> None:
    url = parse_url(database_url)
    await queue(api, "free", elastic())
    await queue(api, "on-a", elastic(), serverNodeId="node-a")
    await queue(api, "on-b", elastic(), serverNodeId="node-b")
    a, b, b_twin = Replicas(url, "node-a"), Replicas(url, "node-b"), Replicas(url, "node-b")
    try:
        led_a = await a.try_lead()
        led_b = await b.try_lead()
        assert led_a == Led(unpinned=True, pinned=True)
        assert led_b == Led(unpinned=False, pinned=True)  # not the leader, yet its own
        assert await b_twin.try_lead() == Led(unpinned=False, pinned=False)
        node_a = Controller(store, clock=clock, server_url="http://a", node_id="node-a")
        node_b = Controller(store, clock=clock, server_url="http://b", node_id="node-b")
        assert {d["scope"] for d in await node_a.tick(led_a)} == {"free", "on-a"}
        assert {d["scope"] for d in await node_b.tick(led_b)} == {"on-b"}
        await b.release()  # node b's server stops: its twin takes over its queues
        assert await b_twin.try_lead() == Led(unpinned=False, pinned=True)
        await a.release()
        assert (await b_twin.try_lead()).unpinned  # and the cluster, once a is gone
    finally:
        for replica in (a, b, b_twin):
            await replica.release()


async def test_a_tick_by_hand_with_the_loop_off_lets_go_of_leadership(
    api: httpx.AsyncClient, database_url: str
) -> None:
    """A server whose loop is off (ELASTICITY_ENABLED=false) leads only for the tick it is
    asked to run; it must not keep the controller from the servers that loop."""
    await queue(api, "q", elastic())
    response = await api.post(TICK)
    assert response.status_code == 200, response.text
    other = AdvisoryLock(parse_url(database_url))
    try:
        assert await other.try_lead()
        refused = await api.post(TICK)  # while another server leads: refused, clearly
        assert refused.status_code == 409
        assert "another server runs the elasticity controller" in refused.text
    finally:
        await other.release()


async def test_the_lock_connection_drops_a_silent_peer_within_seconds(database_url: str) -> None:
    """A leader whose machine vanishes sends no goodbye: the database must drop its
    session (and the lock) in seconds, not after the kernel's two-hour keep-alive."""
    lock = AdvisoryLock(parse_url(database_url))
    try:
        assert await lock.try_lead()
        assert lock._conn is not None
        cursor = await lock._conn.execute(
            "SELECT current_setting('tcp_keepalives_idle'),"
            " current_setting('tcp_keepalives_interval'),"
            " current_setting('tcp_keepalives_count'), current_setting('tcp_user_timeout')"
        )
        idle, interval, count, user_timeout = await cursor.fetchone() or ()
        # over TCP (as the tests connect) the session's own values, not the defaults
        assert (idle, interval, count) == ("5", "2", "5")
        assert user_timeout in {"15s", "15000ms", "15000"}
        assert int(idle) + int(interval) * int(count) <= DEAD_PEER_S
    finally:
        await lock.release()
