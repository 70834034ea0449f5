"""The dashboard's sessions, kept in the store (both stores): a cookie is an opaque id
that signing out, its token's revocation, its expiry and a new admin token end, on every
replica; it holds no token in any form."""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import AsyncIterator
from datetime import timedelta

import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI
from sqlalchemy import func, insert, select

from lakeshore.api.app import create_app
from lakeshore.config import Settings
from lakeshore.services.sessions import MAX_AGE_S, SWEEP_BATCH
from lakeshore.store import ui_sessions as session_store
from lakeshore.store.engine import Store
from lakeshore.store.tables import ui_sessions
from tests.conftest import ADMIN, ADMIN_TOKEN, FakeClock

NS = "/v1/namespaces/default"
PAGE = "/ui/ns/default/queues"


@pytest.fixture
async def app(settings: Settings, clock: FakeClock) -> AsyncIterator[FastAPI]:
    made = create_app(settings, clock=clock)
    async with LifespanManager(made):
        yield made


@pytest.fixture
async def replica(settings: Settings, clock: FakeClock) -> AsyncIterator[FastAPI]:
    """A second server on the same database, as another replica would be."""
    made = create_app(settings, clock=clock)
    async with LifespanManager(made):
        yield made


def client(app: FastAPI, headers: dict[str, str] | None = None) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://lakeshore.test",
        headers=headers or {},
    )


async def signed_in(app: FastAPI, token: str) -> str:
    """Sign in to ``app`` with ``token``: the session cookie's value."""
    async with client(app) as browser:
        form = await browser.get("/ui/login")
        found = re.search(r'name="csrf" value="([0-9a-f]+)"', form.text)
        assert found, form.text
        signed = await browser.post("/ui/login", data={"token": token, "csrf": found.group(1)})
        assert signed.status_code == 303, signed.text
        value = browser.cookies.get("lakeshore_session")
        assert value
        return value


async def page_with(app: FastAPI, cookie: str, path: str = PAGE) -> httpx.Response:
    """``path`` asked with a copy of a session cookie (as one taken from a browser)."""
    async with client(app, {"Cookie": f"lakeshore_session={cookie}"}) as browser:
        return await browser.get(path)


def opens(answer: httpx.Response) -> bool:
    if answer.status_code == 303:
        assert answer.headers["location"] == "/ui/login"
        return False
    assert answer.status_code == 200, answer.text
    return True


async def sign_out(app: FastAPI, cookie: str) -> None:
    async with client(app, {"Cookie": f"lakeshore_session={cookie}"}) as browser:
        page = await browser.get(PAGE)
        found = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
        assert found, page.text
        out = await browser.post("/ui/logout", data={"csrf": found.group(1)})
        assert out.status_code == 303
        assert out.headers["location"] == "/ui/login"


async def issued_token(app: FastAPI) -> dict[str, str]:
    async with client(app, ADMIN) as api:
        issued = await api.post(f"{NS}/tokens", json={"name": "ui"})
    assert issued.status_code == 201, issued.text
    return dict(issued.json())


async def test_a_cookie_captured_before_sign_out_is_refused_after_it(app: FastAPI) -> None:
    captured = await signed_in(app, ADMIN_TOKEN)
    assert opens(await page_with(app, captured))

    await sign_out(app, captured)

    assert not opens(await page_with(app, captured))
    async with client(app, {"Cookie": f"lakeshore_session={captured}"}) as browser:
        live = await browser.get(PAGE, headers={"HX-Request": "true"})
    assert (live.status_code, live.headers["hx-redirect"]) == (401, "/ui/login")


async def test_a_cookie_is_refused_once_its_token_is_revoked(app: FastAPI, store: Store) -> None:
    issued = await issued_token(app)
    captured = await signed_in(app, issued["token"])
    assert opens(await page_with(app, captured))

    async with client(app, ADMIN) as api:
        assert (await api.delete(f"{NS}/tokens/{issued['id']}")).status_code == 200

    assert not opens(await page_with(app, captured))
    async with store.read() as conn:  # and its rows went with it
        left = await conn.scalar(select(func.count()).select_from(ui_sessions))
    assert left == 0


async def test_a_session_ends_twelve_hours_after_its_sign_in(
    app: FastAPI, clock: FakeClock
) -> None:
    captured = await signed_in(app, ADMIN_TOKEN)
    clock.advance(MAX_AGE_S - 1)
    assert opens(await page_with(app, captured))
    clock.advance(1)
    assert not opens(await page_with(app, captured))


async def test_the_cookie_holds_no_token_in_any_form(app: FastAPI, store: Store) -> None:
    issued = await issued_token(app)
    token_id, secret = issued["token"].removeprefix("lks_").split("_", 1)
    for token in (ADMIN_TOKEN, issued["token"]):
        async with client(app) as browser:
            form = await browser.get("/ui/login")
            found = re.search(r'name="csrf" value="([0-9a-f]+)"', form.text)
            assert found
            signed = await browser.post("/ui/login", data={"token": token, "csrf": found.group(1)})
        header = next(c for c in signed.headers.get_list("set-cookie") if "lakeshore_session=" in c)
        cookie = header.split(";")[0].split("=", 1)[1]
        assert re.fullmatch(r"[A-Za-z0-9_-]{43}", cookie), cookie  # 32 random bytes
        forms = {token, secret, token_id, hashlib.sha256(token.encode()).hexdigest()}
        for raw in (token, secret):
            forms.add(base64.urlsafe_b64encode(raw.encode()).decode().rstrip("="))
            forms.add(base64.b64encode(raw.encode()).decode().rstrip("="))
        for form_of_it in forms:
            assert form_of_it not in header
            assert form_of_it[:16] not in cookie
        # and the store keeps a hash of the id, never the id
        async with store.read() as conn:
            kept = [r.id_hash for r in await conn.execute(select(ui_sessions.c.id_hash))]
        assert cookie not in kept and all(len(h) == 64 for h in kept)


async def test_a_second_replica_takes_the_session_and_refuses_it_after_sign_out_on_the_first(
    app: FastAPI, replica: FastAPI
) -> None:
    issued = await issued_token(app)
    for token in (ADMIN_TOKEN, issued["token"]):
        captured = await signed_in(app, token)
        assert opens(await page_with(replica, captured))

        await sign_out(app, captured)

        assert not opens(await page_with(replica, captured))
        assert not opens(await page_with(app, captured))


async def test_a_revocation_on_one_replica_ends_the_session_on_the_other(
    app: FastAPI, replica: FastAPI
) -> None:
    issued = await issued_token(app)
    captured = await signed_in(app, issued["token"])
    async with client(replica, ADMIN) as api:
        assert (await api.delete(f"{NS}/tokens/{issued['id']}")).status_code == 200
    assert not opens(await page_with(app, captured))


async def test_a_new_admin_token_ends_every_session(
    app: FastAPI, settings: Settings, clock: FakeClock
) -> None:
    captured = await signed_in(app, ADMIN_TOKEN)
    renewed = settings.model_copy(update={"admin_token": "a-new-admin-token-for-all"})
    restarted = create_app(renewed, clock=clock)
    async with LifespanManager(restarted):
        assert not opens(await page_with(restarted, captured))


async def test_signing_in_again_ends_the_session_the_browser_held(app: FastAPI) -> None:
    async with client(app) as browser:
        for _ in range(2):
            form = await browser.get("/ui/login")
            found = re.search(r'name="csrf" value="([0-9a-f]+)"', form.text)
            assert found
            first = browser.cookies.get("lakeshore_session")
            signed = await browser.post(
                "/ui/login", data={"token": ADMIN_TOKEN, "csrf": found.group(1)}
            )
            assert signed.status_code == 303
    assert first and first != browser.cookies.get("lakeshore_session")
    assert not opens(await page_with(app, first))


async def test_a_sign_in_deletes_expired_sessions(
    app: FastAPI, store: Store, clock: FakeClock
) -> None:
    for _ in range(3):
        await signed_in(app, ADMIN_TOKEN)
    clock.advance(MAX_AGE_S)
    kept = await signed_in(app, ADMIN_TOKEN)
    async with store.read() as conn:
        left = await conn.scalar(select(func.count()).select_from(ui_sessions))
    assert left == 1
    assert opens(await page_with(app, kept))


async def test_expired_sessions_are_deleted_a_bounded_batch_at_a_time(
    store: Store, clock: FakeClock
) -> None:
    now = clock()
    rows = [
        {
            "id_hash": f"{n:064x}",
            "token_id": None,
            "created_at": now - timedelta(seconds=MAX_AGE_S + n),
            "expires_at": now - timedelta(seconds=n),
        }
        for n in range(SWEEP_BATCH * 2 + 10)
    ]
    async with store.write() as conn:
        await conn.execute(insert(ui_sessions), rows)
    async with store.write() as conn:
        assert await session_store.delete_expired(conn, now, SWEEP_BATCH) == SWEEP_BATCH
    async with store.write() as conn:
        assert await session_store.delete_expired(conn, now, SWEEP_BATCH) == SWEEP_BATCH
    async with store.write() as conn:
        assert await session_store.delete_expired(conn, now, SWEEP_BATCH) == 10
        assert await session_store.delete_expired(conn, now, SWEEP_BATCH) == 0
