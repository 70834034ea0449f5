from __future__ import annotations

import httpx
from asgi_lifespan import LifespanManager

from lakeshore.api.app import create_app
from lakeshore.config import Settings
from lakeshore.store.engine import Store, create_engine_for, parse_url
from tests.conftest import ADMIN, FakeClock


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
