"""Shared fixtures: both stores (SQLite and PostgreSQL), a fake clock, the API in-process.

Every store-level and API test runs once per backend. PostgreSQL is found at
``LAKESHORE_TEST_DATABASE_URL`` (default ``postgresql://postgres@127.0.0.1:5432/test``);
the suite makes its own database there and drops it at the end. When PostgreSQL cannot
be reached its tests are skipped — except under ``CI=true``, where that fails the run.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import psycopg
import pytest
from asgi_lifespan import LifespanManager
from sqlalchemy.engine import make_url

from lakeshore.api.app import create_app
from lakeshore.config import Settings
from lakeshore.store.engine import Store, create_engine_for, migrate, parse_url
from lakeshore.store.tables import metadata
from tests import hangs
from tests.moto_server import moto_url  # noqa: F401  # a fixture, for every test module

PG_URL = os.environ.get("LAKESHORE_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
ADMIN_TOKEN = "lks-test-admin-token"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
BACKENDS = ["sqlite", "postgresql"]


def _libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def pg_server() -> str:
    """The PostgreSQL server URL the suite may create databases on."""
    try:
        with psycopg.connect(_libpq(PG_URL), connect_timeout=5):
            pass
    except psycopg.Error as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"PostgreSQL at {PG_URL} is unreachable under CI=true: {exc}")
        pytest.skip(f"PostgreSQL at {PG_URL} is unreachable: {exc}")
    return PG_URL


def create_pg_database(server_url: str) -> str:
    name = f"lakeshore_test_{os.getpid()}_{secrets.token_hex(4)}"
    with psycopg.connect(_libpq(server_url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return make_url(server_url).set(database=name).render_as_string(hide_password=False)


def drop_pg_database(server_url: str, url: str) -> None:
    name = make_url(url).database
    with psycopg.connect(_libpq(server_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def fresh_pg_url(pg_server: str) -> Iterator[str]:
    """An empty PostgreSQL database of this test's own (for server processes)."""
    url = create_pg_database(pg_server)
    yield url
    drop_pg_database(pg_server, url)


@pytest.fixture(scope="session")
def pg_database(pg_server: str) -> Iterator[str]:
    """One migrated database for the session; each test starts from empty tables."""
    url = create_pg_database(pg_server)
    migrate(parse_url(url))
    yield url
    drop_pg_database(pg_server, url)


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "lakeshore.db"
    migrate(parse_url(f"sqlite:///{path}"))
    return path


def _truncate(url: str) -> None:
    names = ", ".join(f'"{t.name}"' for t in metadata.sorted_tables)
    with psycopg.connect(_libpq(url), autocommit=True) as conn:
        conn.execute(f"TRUNCATE {names} RESTART IDENTITY CASCADE")


@pytest.fixture(params=BACKENDS)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated, empty store on each backend in turn."""
    if request.param == "sqlite":
        path = tmp_path / "lakeshore.db"
        shutil.copy(request.getfixturevalue("sqlite_template"), path)
        return f"sqlite:///{path}"
    url: str = request.getfixturevalue("pg_database")
    _truncate(url)
    return url


@pytest.fixture(autouse=True)
def _dump_tasks_before_the_timeout(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test about to hit its time limit prints what its tasks wait for (``hangs``)."""
    marker = request.node.get_closest_marker("timeout")
    limit = (
        float(marker.args[0])
        if marker and marker.args
        else float(request.config.getini("timeout") or 0)
    )
    if limit <= 0:
        yield
        return
    with hangs.arm(request.node.nodeid, max(limit - 3, limit * 0.9)):
        yield


@dataclass
class FakeClock:
    """A clock tests move by hand."""

    now: datetime = field(default_factory=lambda: datetime(2026, 1, 1, 12, 0, tzinfo=UTC))

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    s = Store(create_engine_for(parse_url(database_url)))
    yield s
    await s.close()


# custom scalers the test server allows: the paths the fuzz tests write, and real ones
ALLOWED_SCALERS = (
    "pkg.mod:fn",
    "a:b.c",
    "_x.y:z",
    "tests.udfs:scaler_up",
    "tests.udfs:scaler_raises",
    "tests.udfs:scaler_hangs",
    "tests.udfs:scaler_garbage",
)


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    return Settings(
        database_url=database_url,
        data_dir=tmp_path / "data",
        admin_token=ADMIN_TOKEN,
        reaper_interval_s=0,  # tests sweep by hand, with the fake clock
        elasticity_enabled=False,  # and tick by hand (POST /v1/admin/elasticity/tick)
        allowed_scalers=",".join(ALLOWED_SCALERS),
    )


@pytest.fixture
async def api(settings: Settings, clock: FakeClock) -> AsyncIterator[httpx.AsyncClient]:
    """The API in-process, on the parametrized store, authenticated as the admin."""
    app = create_app(settings, clock=clock)
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://lakeshore.test", headers=ADMIN
        ) as client:
            yield client
