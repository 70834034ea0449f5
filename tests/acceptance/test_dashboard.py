"""The dashboard in a real headless Chromium (the system's ``chromium``, driven by
Playwright) against a real ``lakeshore server`` and real daemons. Each test saves a
screenshot under ``test-artifacts/dashboard/``.

The pages' HTTP behaviour on both stores is in ``tests/integration/test_ui.py``; here the
server runs on SQLite, so the browser's time goes to what only a browser shows: htmx's
live updates, the forms, the CSRF header, the chart.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.acceptance.conftest import WIDE, LakeshoreServer, clean_env, running_server
from tests.acceptance.test_daemons import start_daemon, stop

pytestmark = pytest.mark.acceptance


ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "dashboard"
CHROMIUM = os.environ.get("LAKESHORE_TEST_CHROMIUM") or shutil.which("chromium") or ""
NS = "/v1/namespaces/default"
WAIT_MS = 30_000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LakeshoreServer]:
    base = tmp_path_factory.mktemp("dashboard")
    env = clean_env(COLUMNS=WIDE, ELASTICITY_INTERVAL_S="0.5", LAKESHORE_REAPER_INTERVAL_S="0.5")
    with running_server("sqlite", str(base / "l.db"), base / "data", base / "s.log", env) as srv:
        yield srv


@pytest.fixture(scope="module")
def http(server: LakeshoreServer) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {server.admin_token}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def chromium() -> Iterator[Browser]:
    if not CHROMIUM:
        if os.environ.get("CI"):
            pytest.fail("no chromium on this machine: .ci/run installs Debian's chromium")
        pytest.skip("no chromium on this machine (apt-get install chromium)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(
    chromium: Browser, server: LakeshoreServer, request: pytest.FixtureRequest
) -> Iterator[Page]:
    """A fresh browser context (no cookies) at 1280x800 that records requests to any other
    origin; its screenshot is saved when the test ends."""
    context = chromium.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(WAIT_MS)
    tab = context.new_page()
    outside: list[str] = []
    tab.on("request", lambda r: None if r.url.startswith(server.url) else outside.append(r.url))
    try:
        yield tab
        assert outside == [], f"requests off the server: {outside}"
    finally:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        name = re.sub(r"[^\w.-]+", "_", request.node.name)
        tab.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
        context.close()


def shot(page: Page, name: str, *, full: bool = False) -> None:
    """A screenshot of the page now (docs/dashboard.md shows some)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=full)


def sign_in(page: Page, server: LakeshoreServer, token: str) -> None:
    page.goto(f"{server.url}/ui")
    page.fill("#token", token)
    page.click("#sign-in")


def namespace_token(http: httpx.Client, ns: str) -> str:
    assert http.post("/v1/namespaces", json={"name": ns}).status_code in (201, 409)
    issued = http.post(f"/v1/namespaces/{ns}/tokens", json={"name": "browser"})
    assert issued.status_code == 201, issued.text
    return str(issued.json()["token"])


def test_signing_in_opens_the_queues_page(page: Page, server: LakeshoreServer) -> None:
    page.goto(f"{server.url}/ui")
    assert page.url.endswith("/ui/login")
    page.fill("#token", "lks_wrong_token")
    page.click("#sign-in")
    assert "invalid" in page.inner_text("[role=alert]").lower()

    sign_in(page, server, server.admin_token)

    page.wait_for_selector("#queues")
    assert page.url.endswith("/ui/ns/default/queues")
    cookie = next(c for c in page.context.cookies() if c["name"] == "lakeshore_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert page.evaluate("document.cookie") == ""  # out of the page's scripts' reach


def test_a_namespace_token_cannot_see_another_namespace(
    page: Page, server: LakeshoreServer, http: httpx.Client
) -> None:
    token = namespace_token(http, "team-a")
    namespace_token(http, "team-b")
    assert http.post("/v1/namespaces/team-b/queues", json={"name": "theirs"}).status_code == 201
    assert http.post("/v1/namespaces/team-a/queues", json={"name": "ours"}).status_code == 201

    sign_in(page, server, token)
    page.wait_for_selector("tr[data-queue=ours]")
    assert page.locator("tr[data-queue=theirs]").count() == 0
    assert page.locator("#namespace-switch").count() == 0
    assert "team-a" in page.inner_text("#namespace")

    answer = page.goto(f"{server.url}/ui/ns/team-b/queues/theirs")
    assert answer is not None and answer.status == 404
    assert "not found" in page.inner_text("[role=alert]")
    assert "theirs" not in page.inner_text("main").replace("/theirs", "")


def test_the_pending_count_falls_while_a_daemon_drains_the_queue(
    page: Page, server: LakeshoreServer, http: httpx.Client, tmp_path: Path
) -> None:
    queue = "drained"
    items = [{"fn": "tests.udfs:sleep", "args": [0.15]} for _ in range(40)]
    made = http.post(f"{NS}/queues/{queue}/invocations/batch", json={"invocations": items})
    assert made.status_code == 201, made.text
    sign_in(page, server, server.admin_token)
    cell = page.locator(f"tr[data-queue={queue}] td.pending")
    expect(cell).to_have_text("40")

    daemon = start_daemon(server, tmp_path / "daemon.log", "--queue", queue, "--capacity", "2")
    try:
        seen = {int(cell.inner_text())}
        deadline = time.monotonic() + 90
        while 0 not in seen and time.monotonic() < deadline:
            page.wait_for_timeout(500)  # the page updates itself every few seconds
            pending = int(cell.inner_text())
            if 0 < pending < 40 and not any(0 < n < 40 for n in seen):
                shot(page, "queues")  # mid-drain
            seen.add(pending)
        assert 0 in seen, (seen, (tmp_path / "daemon.log").read_text())
        assert any(0 < n < 40 for n in seen), seen  # watched it fall, not only jump
    finally:
        stop(daemon)
    page.click(f"tr[data-queue={queue}] a")
    expect(page.locator("#series-chart")).to_have_attribute("data-points", re.compile("[1-9]"))


def test_the_timeline_shows_a_scale_up_with_its_reason(
    page: Page, server: LakeshoreServer, http: httpx.Client
) -> None:
    provider = http.post(f"{NS}/providers", json={"name": "dry-run", "kind": "fake"})
    assert provider.status_code == 201, provider.text
    queue = {
        "name": "elastic",
        "providerRef": "dry-run",
        "elasticity": {"kind": "fully_elastic", "min": 0, "max": 2},
    }
    assert http.post(f"{NS}/queues", json=queue).status_code == 201
    assert http.post(f"{NS}/queues/elastic/invocations", json={"fn": "tests.udfs:noop"}).is_success
    deadline = time.monotonic() + 30
    scaled: list[dict[str, str]] = []
    while not scaled and time.monotonic() < deadline:
        events = http.get(f"{NS}/queues/elastic/events").json()["events"]
        scaled = [e for e in events if e["action"] == "scale_up"]
        time.sleep(0.2)
    assert scaled, "the controller did not scale up"

    sign_in(page, server, server.admin_token)
    page.goto(f"{server.url}/ui/ns/default/queues/elastic")
    event = page.locator("#decisions li[data-action=scale_up]").first
    assert scaled[-1]["reason"] in event.inner_text()
    assert page.locator("#decisions li[data-action=tick_noop]").count() == 0
    shot(page, "queue", full=True)
    page.check("#verbose")  # the no-ops, as --verbose shows them
    page.wait_for_selector("#decisions li[data-action=tick_noop]")
    page.goto(f"{server.url}/ui/ns/default/fleet")
    assert "dry-run" in page.inner_text("#providers")
    shot(page, "fleet")


def test_a_change_without_the_csrf_token_is_refused(
    page: Page, server: LakeshoreServer, http: httpx.Client
) -> None:
    inv = http.post(f"{NS}/queues/guarded/invocations", json={"fn": "tests.udfs:noop"}).json()
    sign_in(page, server, server.admin_token)
    page.goto(f"{server.url}/ui/ns/default/invocations/{inv['id']}")
    action = f"/ui/ns/default/invocations/{inv['id']}/cancel"

    refused = page.evaluate(
        "async (url) => (await fetch(url, {method: 'POST', credentials: 'same-origin'})).status",
        action,
    )
    assert refused == 403
    assert http.get(f"{NS}/invocations/{inv['id']}").json()["state"] == "pending"

    page.click("#cancel")  # the page's own form carries it
    page.wait_for_selector("#inv-state:has-text('cancelled')")
    assert http.get(f"{NS}/invocations/{inv['id']}").json()["state"] == "cancelled"


def test_the_pages_fit_a_narrow_window(page: Page, server: LakeshoreServer) -> None:
    sign_in(page, server, server.admin_token)
    page.set_viewport_size({"width": 400, "height": 800})
    for path in ("queues", "fleet"):
        page.goto(f"{server.url}/ui/ns/default/{path}")
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, (path, overflow)


def test_a_failed_invocation_shows_its_traceback_and_is_retried_to_success(
    page: Page, server: LakeshoreServer, http: httpx.Client, tmp_path: Path
) -> None:
    fixed = tmp_path / "fixed.txt"  # the fault: this file is missing until it is mended
    body = {"fn": "tests.udfs:fails_until", "args": [str(fixed)], "max_attempts": 1}
    inv = http.post(f"{NS}/queues/flaky/invocations", json=body)
    assert inv.status_code == 201, inv.text
    invocation = inv.json()["id"]
    daemon = start_daemon(server, tmp_path / "daemon.log", "--queue", "flaky")
    try:
        sign_in(page, server, server.admin_token)
        page.wait_for_selector("#queues")
        url = f"{server.url}/ui/ns/default/invocations/{invocation}"
        state = reload_until(page, url, ("failed",))
        assert state == "failed", (tmp_path / "daemon.log").read_text()
        assert "FileNotFoundError" in page.inner_text("#inv-error")
        traceback = page.inner_text("#inv-traceback")
        assert "Traceback" in traceback and "fails_until" in traceback
        shot(page, "invocation-failed", full=True)

        fixed.write_text("mended", encoding="utf-8")
        page.click("#retry")
        state = reload_until(page, url, ("succeeded", "failed"))
        assert state == "succeeded", (tmp_path / "daemon.log").read_text()
        assert page.inner_text("#inv-result").strip() == '"mended"'
        assert page.inner_text("#inv-attempts").startswith("2 of 2")
        after = http.get(f"{NS}/invocations/{invocation}").json()
        assert (after["id"], after["state"], after["attempts"]) == (invocation, "succeeded", 2)
    finally:
        stop(daemon)


def reload_until(page: Page, url: str, states: tuple[str, ...], seconds: float = 60) -> str:
    """Open ``url`` again (as a user presses reload) until the invocation's state is one of
    ``states`` or ``seconds`` pass; the state last seen."""
    deadline = time.monotonic() + seconds
    while True:
        page.goto(url)
        state = page.inner_text("#inv-state").strip()
        if state in states or time.monotonic() > deadline:
            return state
        page.wait_for_timeout(300)
