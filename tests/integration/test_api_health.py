from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
from asgi_lifespan import LifespanManager
from sqlalchemy import text

from lakeshore.api.app import create_app
from lakeshore.config import Settings
from lakeshore.store.engine import Store, create_engine_for, head_revision, parse_url
from tests.conftest import ADMIN, ADMIN_TOKEN, FakeClock


async def test_health_reports_the_backend(api: httpx.AsyncClient, settings: Settings) -> None:
    body = (await api.get("/healthz")).json()
    expected = "sqlite" if settings.resolved_database_url.startswith("sqlite") else "postgresql"
    assert body["status"] == "ok"
    assert body["database"] == expected


async def test_a_lost_database_is_503_not_500(settings: Settings, clock: FakeClock) -> None:
    app = create_app(settings, clock=clock)
    async with LifespanManager(app) as manager:
        state = app.state.lakeshore
        healthy_store = state.store
        state.store = Store(create_engine_for(parse_url("postgresql://postgres@127.0.0.1:1/gone")))
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://t", headers=ADMIN
        ) as api:
            health = await api.get("/healthz")
            queues = await api.get("/v1/namespaces/default/queues")
        await state.store.close()
        state.store = healthy_store
    for response in (health, queues):
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "store_unavailable"


async def test_readyz_answers_ready_without_a_token_with_each_check(
    api: httpx.AsyncClient, settings: Settings
) -> None:
    answer = await api.get("/readyz", headers={"Authorization": ""})

    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["status"] == "ready"
    expected = {"store": "ok", "schema": "ok"}
    if settings.resolved_database_url.startswith("postgresql"):
        expected["wakeups"] = "ok"  # the listener for other replicas' wake-ups
    assert body["checks"] == expected


async def test_readyz_is_503_on_a_store_whose_schema_is_behind_this_server(
    settings: Settings, clock: FakeClock
) -> None:
    app = create_app(settings, clock=clock)
    async with LifespanManager(app) as manager:
        store = app.state.lakeshore.store
        async with store.write() as conn:  # as if an older version had migrated it last
            await conn.execute(text("UPDATE alembic_version SET version_num = '0004'"))
        transport = httpx.ASGITransport(app=manager.app)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as api:
                behind = await api.get("/readyz")
                alive = await api.get("/healthz")
        finally:  # the PostgreSQL database is the session's
            async with store.write() as conn:
                await conn.execute(
                    text("UPDATE alembic_version SET version_num = :head"),
                    {"head": head_revision()},
                )

    assert behind.status_code == 503
    assert behind.json()["status"] == "not_ready"
    assert behind.json()["checks"]["store"] == "ok"
    assert behind.json()["checks"]["schema"] == (
        f"at revision 0004; this server needs {head_revision()}"
    )
    assert alive.status_code == 200  # alive, only not ready


async def test_readyz_is_503_when_the_store_is_unreachable(
    settings: Settings, clock: FakeClock
) -> None:
    app = create_app(settings, clock=clock)
    async with LifespanManager(app) as manager:
        state = app.state.lakeshore
        healthy_store = state.store
        state.store = Store(create_engine_for(parse_url("postgresql://postgres@127.0.0.1:1/gone")))
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as api:
            answer = await api.get("/readyz")
        await state.store.close()
        state.store = healthy_store

    assert answer.status_code == 503
    assert answer.json()["status"] == "not_ready"
    assert answer.json()["checks"]["store"] == "unreachable"


async def test_readyz_is_503_while_the_wakeup_listener_is_disconnected(
    fresh_pg_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    """PostgreSQL only: the listener's connection is cut from the server side; readiness
    drops until it reconnects by itself."""
    settings = Settings(
        database_url=fresh_pg_url,
        data_dir=tmp_path / "data",
        admin_token=ADMIN_TOKEN,
        reaper_interval_s=0,
        elasticity_enabled=False,
    )
    app = create_app(settings, clock=clock)
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as api:
            assert (await api.get("/readyz")).status_code == 200
            listening = app.state.lakeshore.wakeups_listening
            async with app.state.lakeshore.store.write() as conn:
                cut = await conn.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND query LIKE 'LISTEN %'"
                    )
                )
                assert cut.scalars().all() == [True]
            for _ in range(1000):  # the listener notices within a few polls
                if not listening.is_set():
                    break
                await asyncio.sleep(0.01)
            down = await api.get("/readyz")
            async with asyncio.timeout(10):
                await listening.wait()
            up = await api.get("/readyz")

    assert down.status_code == 503
    assert down.json()["checks"]["wakeups"] == "not listening for other replicas' wake-ups"
    assert up.status_code == 200
