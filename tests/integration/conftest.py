"""The integration tests' own conftest: pytest rewrites the asserts in ``fuzzing.py``.

The API fuzz tests' shared helpers (``send``, ``assert_refusal``, ``listing``) check with
``assert``; pytest only rewrites the asserts of test modules and conftests unless told,
so without this their failures would lose pytest's explanation of the values compared.
The fixtures these tests use (``api``, ``settings``) are in ``tests/conftest.py``;
``app_transport`` (the app for a daemon driven in-process) and ``launch_tokens`` (the
worker token of each launch) are here.
"""

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager

from lakeshore.api.app import create_app
from lakeshore.config import Settings
from lakeshore.providers import LaunchRequest
from lakeshore.services.fleet import fleet_ops
from tests.conftest import FakeClock

pytest.register_assert_rewrite(
    "tests.integration.fuzzing",
    "tests.integration.edge_targets",
    "tests.integration.daemons",
    "tests.integration.launches",
)


@pytest.fixture
async def app_transport(
    settings: Settings, clock: FakeClock
) -> AsyncIterator[httpx.AsyncBaseTransport]:
    # short leases, so daemons heartbeat every 0.1 s (the fake clock expires none)
    app = create_app(settings.model_copy(update={"lease_s": 0.3}), clock=clock)
    async with LifespanManager(app) as manager:
        yield httpx.ASGITransport(app=manager.app)


@pytest.fixture
def launch_tokens(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The worker token each launch the controller makes is handed, in order."""
    seen: list[str] = []

    def recorded(*args: Any, **kwargs: Any) -> LaunchRequest:
        made = LaunchRequest(*args, **kwargs)
        assert made.token is not None
        seen.append(made.token)
        return made

    monkeypatch.setattr(fleet_ops, "LaunchRequest", recorded)
    return seen
