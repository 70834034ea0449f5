"""The dashboard's queue page shows each of the queue's schedules and its next slot."""

from __future__ import annotations

import httpx

from tests.conftest import ADMIN_TOKEN
from tests.integration.test_ui import (  # noqa: F401  # app, api and browser are fixtures
    NS,
    api,
    app,
    browser,
    sign_in,
)


async def test_the_queue_page_shows_each_schedule_s_next_slot(
    api: httpx.AsyncClient,  # noqa: F811
    browser: httpx.AsyncClient,  # noqa: F811
) -> None:
    assert (await api.post(f"{NS}/queues", json={"name": "reports"})).status_code == 201
    for body in (
        {"name": "beat", "every_s": 2, "fn": "tests.udfs:add"},
        {"name": "nightly", "cron": "0 3 * * *", "fn": "tests.udfs:add", "enabled": False},
    ):
        made = await api.post(f"{NS}/queues/reports/schedules", json=body)
        assert made.status_code == 201, made.text
    await sign_in(browser, ADMIN_TOKEN)
    page = await browser.get("/ui/ns/default/queues/reports")
    assert page.status_code == 200
    assert "<strong>beat</strong> next 2026-01-01T12:00:02Z" in page.text
    assert "<strong>nightly</strong> next — (paused)" in page.text
    live = await browser.get("/ui/ns/default/queues/reports", headers={"HX-Request": "true"})
    assert 'id="q-schedules"' in live.text
