"""The dashboard over HTTP (both stores): sign-in and its cookie, CSRF on every change,
one namespace's token kept to its namespace, the pages' contents, and the shared read
behind the queues page. The real-browser tests are in ``tests/acceptance/test_dashboard.py``."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI

from lakeshore.api.app import create_app
from lakeshore.api.deps import AppState
from lakeshore.config import Settings
from tests.conftest import ADMIN, ADMIN_TOKEN, FakeClock

NS = "/v1/namespaces/default"


@pytest.fixture
async def app(settings: Settings, clock: FakeClock) -> AsyncIterator[FastAPI]:
    made = create_app(settings, clock=clock)
    async with LifespanManager(made):
        yield made


@pytest.fixture
async def api(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """The admin's API client (this module's own, of :func:`app`)."""
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://lakeshore.test", headers=ADMIN
    ) as client:
        yield client


@pytest.fixture
async def browser(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the same app with no Authorization header: it holds cookies."""
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://lakeshore.test"
    ) as client:
        yield client


def csrf_of(page: httpx.Response) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
    assert found, page.text
    return found.group(1)


async def sign_in(browser: httpx.AsyncClient, token: str) -> httpx.Response:
    form = await browser.get("/ui/login")
    assert form.status_code == 200
    return await browser.post("/ui/login", data={"token": token, "csrf": csrf_of(form)})


async def namespace_token(api: httpx.AsyncClient, ns: str) -> str:
    assert (await api.post("/v1/namespaces", json={"name": ns})).status_code == 201
    issued = await api.post(f"/v1/namespaces/{ns}/tokens", json={"name": "ui"})
    assert issued.status_code == 201, issued.text
    return str(issued.json()["token"])


def app_state(app: FastAPI) -> AppState:
    state: AppState = app.state.lakeshore
    return state


async def test_without_a_session_every_page_sends_the_browser_to_sign_in(
    browser: httpx.AsyncClient,
) -> None:
    for path in ("/ui", "/ui/ns/default/queues", "/ui/ns/default/fleet"):
        answer = await browser.get(path)
        assert answer.status_code == 303, path
        assert answer.headers["location"] == "/ui/login"
    live = await browser.get("/ui/ns/default/queues", headers={"HX-Request": "true"})
    assert (live.status_code, live.headers["hx-redirect"]) == (401, "/ui/login")


async def test_signing_in_sets_a_strict_httponly_session_cookie(
    browser: httpx.AsyncClient,
) -> None:
    signed = await sign_in(browser, ADMIN_TOKEN)

    assert signed.status_code == 303
    assert signed.headers["location"] == "/ui/ns/default/queues"
    cookie = next(c for c in signed.headers.get_list("set-cookie") if "lakeshore_session=" in c)
    attributes = {part.strip().lower() for part in cookie.split(";")}
    assert {"httponly", "samesite=strict", "path=/ui"} <= attributes
    assert ADMIN_TOKEN not in cookie  # an opaque session id: see test_ui_sessions.py
    page = await browser.get("/ui/ns/default/queues")
    assert page.status_code == 200
    assert "Content-Security-Policy" in page.headers
    assert "default-src 'self'" in page.headers["content-security-policy"]


@pytest.mark.parametrize("token", ["", "not-a-token", "lks_nope_nope"])
async def test_a_wrong_token_is_refused_on_the_sign_in_page(
    browser: httpx.AsyncClient, token: str
) -> None:
    answer = await sign_in(browser, token)

    assert answer.status_code == 401
    assert 'role="alert"' in answer.text
    assert "lakeshore_session" not in answer.headers.get("set-cookie", "")


async def test_sign_in_without_its_csrf_token_is_refused(browser: httpx.AsyncClient) -> None:
    await browser.get("/ui/login")  # the cookie, but not the form's token
    answer = await browser.post("/ui/login", data={"token": ADMIN_TOKEN})

    assert answer.status_code == 403
    assert "CSRF" in answer.text


async def test_a_forged_session_cookie_is_no_session(browser: httpx.AsyncClient) -> None:
    browser.cookies.set("lakeshore_session", f"{ADMIN_TOKEN}.AAAA.BBBB", path="/ui")
    answer = await browser.get("/ui/ns/default/queues")
    assert answer.status_code == 303


async def test_a_namespace_token_sees_its_namespace_only(
    api: httpx.AsyncClient, browser: httpx.AsyncClient
) -> None:
    token = await namespace_token(api, "team-a")
    await namespace_token(api, "team-b")
    assert (await api.post("/v1/namespaces/team-b/queues", json={"name": "secret"})).is_success
    assert (await api.post("/v1/namespaces/team-a/queues", json={"name": "mine"})).is_success

    signed = await sign_in(browser, token)
    assert signed.headers["location"] == "/ui/ns/team-a/queues"
    own = await browser.get("/ui/ns/team-a/queues")
    assert own.status_code == 200 and "mine" in own.text and "secret" not in own.text
    assert "team-b" not in own.text  # no switch to a namespace it cannot see
    for path in (
        "/ui/ns/team-b/queues",
        "/ui/ns/team-b/queues/secret",
        "/ui/ns/team-b/fleet",
        "/ui/ns/team-b/queues/secret/series",
    ):
        refused = await browser.get(path)
        assert refused.status_code == 404, path
        assert "namespace &#34;team-b&#34; not found" in refused.text


async def test_the_admin_can_switch_namespaces(
    api: httpx.AsyncClient, browser: httpx.AsyncClient
) -> None:
    await namespace_token(api, "team-c")
    await sign_in(browser, ADMIN_TOKEN)
    page = await browser.get("/ui/ns/default/queues")
    assert 'id="namespace-switch"' in page.text and "<option>team-c</option>" in page.text
    assert (await browser.get("/ui/ns/team-c/queues")).status_code == 200


async def test_a_revoked_token_ends_its_session(
    api: httpx.AsyncClient, browser: httpx.AsyncClient
) -> None:
    issued = await api.post(f"{NS}/tokens", json={"name": "leaving"})
    await sign_in(browser, issued.json()["token"])
    assert (await browser.get("/ui/ns/default/queues")).status_code == 200

    assert (await api.delete(f"{NS}/tokens/{issued.json()['id']}")).status_code == 200

    assert (await browser.get("/ui/ns/default/queues")).status_code == 303


async def test_the_queue_and_invocation_pages_show_the_store(
    api: httpx.AsyncClient, browser: httpx.AsyncClient
) -> None:
    made = await api.post(
        f"{NS}/queues/pages/invocations",
        json={"fn": "tests.udfs:echo", "args": ["<script>alert(1)</script>"]},
    )
    inv = made.json()
    await sign_in(browser, ADMIN_TOKEN)

    listing = await browser.get("/ui/ns/default/queues")
    assert re.search(r'data-queue="pages".*?class="num pending">1<', listing.text, re.S)
    queue = await browser.get("/ui/ns/default/queues/pages")
    assert queue.status_code == 200 and inv["id"] in queue.text
    assert "Why:" in queue.text
    filtered = await browser.get("/ui/ns/default/queues/pages?state=failed")
    assert inv["id"] not in filtered.text
    bad = await browser.get("/ui/ns/default/queues/pages?state=bogus")
    assert bad.status_code == 422 and "<html" in bad.text
    detail = await browser.get(f"/ui/ns/default/invocations/{inv['id']}")
    assert detail.status_code == 200
    assert "<script>alert(1)</script>" not in detail.text  # escaped
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in detail.text
    assert 'id="cancel"' in detail.text
    missing = await browser.get("/ui/ns/default/invocations/inv_nope")
    assert missing.status_code == 404 and "<html" in missing.text


async def test_cancel_needs_the_pages_csrf_token(
    api: httpx.AsyncClient, browser: httpx.AsyncClient
) -> None:
    inv = (await api.post(f"{NS}/queues/c/invocations", json={"fn": "tests.udfs:noop"})).json()
    await sign_in(browser, ADMIN_TOKEN)
    detail = await browser.get(f"/ui/ns/default/invocations/{inv['id']}")
    action = f"/ui/ns/default/invocations/{inv['id']}/cancel"

    without = await browser.post(action)
    wrong = await browser.post(action, data={"csrf": "0" * 64})
    other_site = await browser.post(
        action, data={"csrf": csrf_of(detail)}, headers={"Origin": "http://evil.example"}
    )
    assert [r.status_code for r in (without, wrong, other_site)] == [403, 403, 403]
    assert (await api.get(f"{NS}/invocations/{inv['id']}")).json()["state"] == "pending"

    done = await browser.post(action, data={"csrf": csrf_of(detail)})
    header = await browser.post(action, headers={"X-CSRF-Token": csrf_of(detail)})
    assert done.status_code == 303
    assert (await api.get(f"{NS}/invocations/{inv['id']}")).json()["state"] == "cancelled"
    assert header.status_code == 303  # the header serves as well (htmx sends it)


async def test_open_pages_share_one_read_per_interval(
    app: FastAPI, api: httpx.AsyncClient, browser: httpx.AsyncClient
) -> None:
    overview = app_state(app).overview
    ticks = [100.0]
    overview.timer = lambda: ticks[0]
    await api.post(f"{NS}/queues/shared/invocations", json={"fn": "tests.udfs:noop"})
    await sign_in(browser, ADMIN_TOKEN)
    before = overview.reads

    for _ in range(5):  # five pages polling within one interval
        page = await browser.get("/ui/ns/default/queues", headers={"HX-Request": "true"})
        assert page.status_code == 200 and "<html" not in page.text
    assert overview.reads == before + 1

    ticks[0] += overview.interval_s
    await browser.get("/ui/ns/default/queues", headers={"HX-Request": "true"})
    assert overview.reads == before + 2
    series = await browser.get("/ui/ns/default/queues/shared/series")
    assert series.json()["points"][-1]["pending"] == 1


async def test_the_fleet_page_lists_daemons_and_providers(
    api: httpx.AsyncClient, browser: httpx.AsyncClient
) -> None:
    made = await api.post(f"{NS}/providers", json={"name": "dry", "kind": "fake"})
    assert made.status_code == 201, made.text
    await sign_in(browser, ADMIN_TOKEN)
    page = await browser.get("/ui/ns/default/fleet")
    assert page.status_code == 200
    assert "dry" in page.text and "no daemon" in page.text


async def test_retry_and_bulk_buttons_need_csrf_and_change_the_store(
    api: httpx.AsyncClient, browser: httpx.AsyncClient
) -> None:
    made = [
        (await api.post(f"{NS}/queues/ui-retry/invocations", json={"fn": "m:f"})).json()
        for _ in range(3)
    ]
    hello = await api.post(
        "/v1/workers/hello", json={"queues": ["ui-retry"], "capabilities": {"max_invocations": 3}}
    )
    worker = hello.json()["id"]
    claimed = await api.post(f"/v1/workers/{worker}/claim", json={"timeout_s": 0, "max": 3})
    results = [
        {
            "id": i["id"],
            "error": {"type": "E", "message": "m", "traceback": "Trace!"},
            "retry": False,
        }
        for i in claimed.json()["invocations"]
    ]
    assert (await api.post(f"/v1/workers/{worker}/results", json={"results": results})).is_success
    await sign_in(browser, ADMIN_TOKEN)
    first = made[0]["id"]
    detail = await browser.get(f"/ui/ns/default/invocations/{first}")
    assert 'id="retry"' in detail.text and "Trace!" in detail.text

    refused = await browser.post(f"/ui/ns/default/invocations/{first}/retry")
    assert refused.status_code == 403
    retried = await browser.post(
        f"/ui/ns/default/invocations/{first}/retry", data={"csrf": csrf_of(detail)}
    )
    assert retried.status_code == 303
    assert (await api.get(f"{NS}/invocations/{first}")).json()["state"] == "pending"

    bulk = await browser.post(
        "/ui/ns/default/queues/ui-retry/bulk",
        data={"csrf": csrf_of(detail), "action": "retry_failed"},
    )
    assert bulk.status_code == 303
    assert bulk.headers["location"].endswith("?touched=2&did=retried")
    page = await browser.get(bulk.headers["location"])
    assert "2 invocation(s) retried" in page.text
    bad = await browser.post(
        "/ui/ns/default/queues/ui-retry/bulk", data={"csrf": csrf_of(detail), "action": "drop"}
    )
    assert bad.status_code == 422
