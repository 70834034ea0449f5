from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from asgi_lifespan import LifespanManager
from sqlalchemy import text
from sqlalchemy.engine import make_url

from lakeshore.api.app import create_app
from lakeshore.api.routes.health import WRITABLE_TTL_S
from lakeshore.config import Settings
from lakeshore.store.engine import Store, create_engine_for, head_revision, migrate, parse_url
from tests.conftest import ADMIN, ADMIN_TOKEN, BACKENDS, FakeClock, drop_pg_database

NS = "/v1/namespaces/default"


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
    expected = {"store": "ok", "writes": "ok", "schema": "ok"}
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


@contextlib.contextmanager
def small_disk(size_mb: int) -> Iterator[Path]:
    """A filesystem of ``size_mb`` of its own (a tmpfs), which a test can fill."""
    if os.geteuid() != 0:
        pytest.skip("a filesystem of the test's own (a tmpfs mount) needs root")
    where = Path(tempfile.mkdtemp(prefix="lakeshore-small-disk-"))
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0755", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        where.rmdir()
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "--lazy", str(where)], check=True)
        where.rmdir()


def fill(disk: Path) -> None:
    """Write to ``disk`` until no byte more fits."""
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for chunk in (1 << 20, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, bytes(chunk))
    finally:
        os.close(fd)


@contextlib.contextmanager
def store_on(disk: Path, backend: str, pg_server: str | None) -> Iterator[str]:
    """A migrated store whose data is on ``disk``: a SQLite file, or a PostgreSQL
    database in a tablespace there (the server's own write-ahead log stays where it is)."""
    if backend == "sqlite":
        url = f"sqlite:///{disk / 'lakeshore.db'}"
        migrate(parse_url(url))
        yield url
        return
    assert pg_server is not None
    try:
        owner = pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("no local postgres user to own a tablespace")
    place = disk / "tablespace"
    place.mkdir()
    shutil.chown(place, owner.pw_uid, owner.pw_gid)
    name = f"lakeshore_small_{os.getpid()}_{secrets.token_hex(4)}"
    libpq = make_url(pg_server).set(drivername="postgresql").render_as_string(False)
    with psycopg.connect(libpq, autocommit=True) as admin:
        try:
            admin.execute(f"CREATE TABLESPACE {name} LOCATION '{place}'")
        except psycopg.Error as exc:  # a server on another machine, or no superuser
            pytest.skip(f"cannot make a tablespace on a local disk: {exc}")
        admin.execute(f'CREATE DATABASE "{name}" TABLESPACE {name}')
    url = make_url(pg_server).set(database=name).render_as_string(hide_password=False)
    try:
        migrate(parse_url(url))
        yield url
    finally:
        drop_pg_database(pg_server, url)
        with psycopg.connect(libpq, autocommit=True) as admin:
            admin.execute(f"DROP TABLESPACE {name}")


@pytest.mark.parametrize("backend", BACKENDS)
async def test_readyz_is_503_while_the_stores_disk_is_full_and_ready_once_freed(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock
) -> None:
    """The store's disk fills: reads still answer, every write fails, and readiness says
    the store is not writable; the verdict is kept a few seconds, then asked again."""
    pg_server = request.getfixturevalue("pg_server") if backend == "postgresql" else None
    with small_disk(64) as disk, store_on(disk, backend, pg_server) as url:
        settings = Settings(
            database_url=url,
            data_dir=tmp_path / "data",
            admin_token=ADMIN_TOKEN,
            reaper_interval_s=0,
            elasticity_enabled=False,
        )
        app = create_app(settings, clock=clock)
        async with (
            LifespanManager(app) as manager,
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=manager.app),
                base_url="http://t",
                headers=ADMIN,
            ) as api,
        ):
            made = await api.post(f"{NS}/queues", json={"name": "q"})
            assert made.status_code == 201, made.text
            before = await api.get("/readyz")
            fill(disk)
            clock.advance(WRITABLE_TTL_S)
            submit = await api.post(f"{NS}/queues/q/invocations", json={"fn": "m:f"})
            full = await api.get("/readyz")
            (disk / "filler").unlink()
            kept = await api.get("/readyz")  # within the verdict's few seconds
            clock.advance(WRITABLE_TTL_S)
            freed = await api.get("/readyz")
            again = await api.post(f"{NS}/queues/q/invocations", json={"fn": "m:f"})

    assert (before.status_code, before.json()["checks"]["writes"]) == (200, "ok")
    assert submit.status_code == 503, submit.text
    assert full.status_code == 503
    assert full.json()["status"] == "not_ready"
    assert full.json()["checks"]["store"] == "ok"  # it answers reads
    assert full.json()["checks"]["writes"] == "not writable: the disk is full"
    assert kept.json()["checks"]["writes"] == "not writable: the disk is full"
    assert (freed.status_code, freed.json()["checks"]["writes"]) == (200, "ok")
    assert again.status_code == 201, again.text
