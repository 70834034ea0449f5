"""Who a token names is remembered for a second (``services.auth.Callers``), on both
stores: a request within it reads no token, so a token revoked meanwhile still works
until its second has passed, and is refused after; a wrong secret for a remembered id is
refused at once. (A worker token is remembered only once bound: a launched daemon's
claim right after its hello, in ``test_worker_token_scope.py``, depends on it.)"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
from asgi_lifespan import LifespanManager
from sqlalchemy import update

from lakeshore.api.app import create_app
from lakeshore.api.deps import AppState
from lakeshore.config import Settings
from lakeshore.services.auth import CALLERS_TTL_S, Callers
from lakeshore.store.tables import tokens
from tests.conftest import ADMIN, FakeClock

QUEUES = "/v1/namespaces/default/queues"


@dataclass
class Served:
    api: httpx.AsyncClient
    state: AppState
    now: float = 0.0  # the callers' timer

    def timer(self) -> float:
        return self.now


@pytest.fixture
async def served(settings: Settings, clock: FakeClock) -> AsyncIterator[Served]:
    app = create_app(settings, clock=clock)
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://lakeshore.test", headers=ADMIN
        ) as client:
            served = Served(client, app.state.lakeshore)
            served.state.callers = Callers(
                served.state.store, served.state.admin_token, timer=served.timer
            )
            yield served


async def test_a_revoked_token_is_refused_once_its_second_has_passed(served: Served) -> None:
    issued = await served.api.post("/v1/namespaces/default/tokens", json={"name": "ci"})
    assert issued.status_code == 201, issued.text
    token = issued.json()["token"]
    mine = {"Authorization": f"Bearer {token}"}
    assert (await served.api.get(QUEUES, headers=mine)).status_code == 200

    async with served.state.store.write() as conn:
        await conn.execute(update(tokens).values(revoked_at=served.state.clock()))
    served.now += CALLERS_TTL_S / 2
    assert (await served.api.get(QUEUES, headers=mine)).status_code == 200  # remembered
    wrong = {"Authorization": f"Bearer {token[:-4]}{'A' if token[-4] != 'A' else 'B'}xyz"}
    assert (await served.api.get(QUEUES, headers=wrong)).status_code == 401
    served.now += CALLERS_TTL_S
    refused = await served.api.get(QUEUES, headers=mine)
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "unauthorized"
