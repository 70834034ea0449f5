"""What the API fuzz tests share: sending a request, the refusal shape, a served app.

``send`` turns a 5xx, or an exception the app let escape, into a test failure, so every
request the fuzz tests make checks the one property they all hold: whatever a caller
sends, the answer is never a 5xx. ``assert_refusal`` checks a 4xx is in the error shape.

``serve`` runs the app in an event loop of the test's own (an anyio blocking portal) with
its lifespan entered, for the schemathesis tests, which call it synchronously;
``serve_fresh`` does so on a fresh store of its own, for a module-scoped fixture whose
tests share one served app (``request.param`` names the store: ``sqlite`` or
``postgresql``).

Not a test module (no ``test_`` prefix); ``conftest.py`` has pytest rewrite its asserts.
"""

from __future__ import annotations

import functools
import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
from anyio.from_thread import BlockingPortal, start_blocking_portal
from asgi_lifespan import LifespanManager
from hypothesis import strategies as st

from lakeshore.api.app import create_app
from lakeshore.config import Settings
from lakeshore.domain.names import NAME_RE
from tests.conftest import ADMIN, ADMIN_TOKEN, FakeClock, create_pg_database, drop_pg_database

BASE_URL = "http://lakeshore.test"
QUEUES = "/v1/namespaces/default/queues"
VALID_NAME = st.from_regex(NAME_RE, fullmatch=True)


# --------------------------------------------------------------------------------------
# The refusal shape, and sending through the `api` fixture
# --------------------------------------------------------------------------------------


def assert_refusal(response: httpx.Response, status: int | None = None) -> dict[str, Any]:
    """A 4xx (``status`` if given) whose body is ``{"error": {"code", "message", ...}}``."""
    assert 400 <= response.status_code < 500, f"{response.status_code}: {response.text[:500]}"
    if status is not None:
        assert response.status_code == status, response.text[:500]
    body = response.json()
    assert isinstance(body, dict), body
    assert list(body) == ["error"], body
    error = body["error"]
    assert isinstance(error, dict), body
    assert isinstance(error.get("code"), str), body
    assert isinstance(error.get("message"), str), body
    assert isinstance(error.get("field", ""), str), body
    return dict(error)


NO_BODY: Any = object()


def json_bytes(value: Any) -> bytes:
    """JSON as a client library would send it (NaN as ``NaN``, lone surrogates escaped)."""
    return json.dumps(value).encode()


async def send(
    api: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    body: Any = NO_BODY,
    content: Any = None,
    headers: dict[str, str] | None = None,
    params: dict[str, str] | None = None,
) -> httpx.Response:
    """One request; a 5xx, or an exception the app let escape, fails the test."""
    if body is not NO_BODY:
        content = json_bytes(body)
        headers = {"content-type": "application/json", **(headers or {})}
    try:
        response = await api.request(method, url, content=content, headers=headers, params=params)
    except Exception as exc:  # the `api` fixture's transport re-raises what the app did not handle
        raise AssertionError(
            f"{method} {url} answered 500: unhandled {type(exc).__name__}: {exc}"
        ) from exc
    assert response.status_code < 500, (
        f"{method} {url} answered {response.status_code}: {response.text[:500]}"
    )
    return response


@functools.cache
def published_schema() -> dict[str, Any]:
    """What the app serves at ``/openapi.json``; building it runs no lifespan, so nothing
    is migrated."""
    schema: dict[str, Any] = create_app(
        Settings(database_url="sqlite://", admin_token=ADMIN_TOKEN)
    ).openapi()
    return schema


def queue_url(name: str, ns: str = "default") -> str:
    return f"/v1/namespaces/{ns}/queues/{quote(name, safe='')}"


async def listing(api: httpx.AsyncClient) -> Any:
    response = await send(api, "GET", QUEUES, params={"include_archived": "true"})
    assert response.status_code == 200, response.text
    return response.json()


# --------------------------------------------------------------------------------------
# The app served in a loop of the test's own
# --------------------------------------------------------------------------------------


@dataclass
class Served:
    """The app with its lifespan entered, reached through an httpx client in its own loop."""

    portal: BlockingPortal
    client: httpx.AsyncClient
    namespace_token: str = ""

    def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        return self.portal.call(functools.partial(self.client.request, method, url, **kwargs))

    def ok(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        response = self.request(method, url, headers=ADMIN, **kwargs)
        assert response.status_code in (200, 201), response.text
        return response


async def _lifespan(app: Any) -> LifespanManager:
    return LifespanManager(app)  # made in the loop: it detects the async library when built


@contextmanager
def serve(app: Any) -> Iterator[Served]:
    """``app`` with its lifespan entered, in a blocking portal's loop, until the block ends."""
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(portal.call(_lifespan, app)) as manager,
        portal.wrap_async_context_manager(
            httpx.AsyncClient(
                # a 500 must come back as a response, not as an exception in the test
                transport=httpx.ASGITransport(app=manager.app, raise_app_exceptions=False),
                base_url=BASE_URL,
            )
        ) as client,
    ):
        yield Served(portal=portal, client=client)


@contextmanager
def serve_fresh(request: Any, tmp_path_factory: Any, **settings: Any) -> Iterator[Served]:
    """The app (fake clock, no background loops) served on a new store of ``request.param``
    (``sqlite``: a copy of the migrated template; ``postgresql``: a database of its own,
    dropped after)."""
    tmp = tmp_path_factory.mktemp("served")
    pg_server = None
    if request.param == "sqlite":
        path = tmp / "lakeshore.db"
        shutil.copy(request.getfixturevalue("sqlite_template"), path)
        url = f"sqlite:///{path}"
    else:
        pg_server = request.getfixturevalue("pg_server")
        url = create_pg_database(pg_server)
    config = Settings(
        database_url=url,
        data_dir=tmp / "data",
        admin_token=ADMIN_TOKEN,
        reaper_interval_s=0,
        elasticity_enabled=False,
        **settings,
    )
    try:
        with serve(create_app(config, clock=FakeClock())) as served:
            yield served
    finally:
        if pg_server is not None:
            drop_pg_database(pg_server, url)
