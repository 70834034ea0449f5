"""Delayed submits through the HTTP API, on both stores: ``delay_s`` / ``not_before``,
not claimable (nor handed on) before the due time, counted as ``scheduled`` until then,
cancellable, their deadline counted from the due time, and the 422s."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI

from lakeshore.api.app import create_app
from lakeshore.config import Settings
from lakeshore.services.taskqueue import reaper
from lakeshore.services.taskqueue.handoff import Waiting
from lakeshore.store.engine import Store
from tests.conftest import ADMIN, ADMIN_TOKEN, FakeClock
from tests.integration.test_api_metrics import queue_value, scrape
from tests.integration.test_api_workers import (
    NS,
    W,
    claim,
    hello,
    queue_id_of,
    waiting_claim,
)
from tests.integration.test_ui import sign_in


@pytest.fixture
def quiet_app(settings: Settings, clock: FakeClock) -> FastAPI:
    """A server whose waiting claims re-check only every 60 s: only a wake-up (or a
    hand-off) answers them sooner."""
    return create_app(settings.model_copy(update={"claim_recheck_s": 60.0}), clock=clock)


@pytest.fixture
async def quiet_api(quiet_app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with LifespanManager(quiet_app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://lakeshore.test", headers=ADMIN
        ) as client:
            yield client


@pytest.fixture
def room(quiet_app: FastAPI, quiet_api: httpx.AsyncClient) -> Waiting:
    waiting: Waiting = quiet_app.state.lakeshore.waiting
    return waiting


async def submit(api: httpx.AsyncClient, queue: str = "q", **body: Any) -> dict[str, Any]:
    response = await api.post(f"{NS}/queues/{queue}/invocations", json={"fn": "m:f", **body})
    assert response.status_code == 201, response.text
    return dict(response.json())


async def stats(api: httpx.AsyncClient, queue: str = "q") -> tuple[int, int]:
    answer = (await api.get(f"{NS}/queues/{queue}/stats")).json()
    assert answer["byState"]["pending"] == answer["pending"]
    return answer["pending"], answer["scheduled"]


async def test_a_delayed_submit_is_scheduled_until_due_then_claimable(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    worker = await hello(api, ["q"])
    later = await submit(api, delay_s=30)
    assert later["state"] == "pending"
    assert await claim(api, worker) == []
    assert await stats(api) == (0, 1)
    clock.advance(29.9)
    assert await claim(api, worker) == []
    clock.advance(0.1)
    assert await stats(api) == (1, 0)
    [got] = await claim(api, worker)
    assert (got["id"], got["state"], got["attempts"]) == (later["id"], "running", 1)


async def test_not_before_is_a_due_time_and_a_due_one_goes_first_in_its_order(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    """Delays change when, not where: once due, work is taken in the queue's order
    (fifo: by submit), and a time already passed is due at once."""
    worker = await hello(api, ["q"], capacity=10)
    at = (clock() + timedelta(seconds=60)).isoformat()
    first = await submit(api, not_before=at)
    clock.advance(0.001)  # each submit a moment after the last: fifo by submit time
    second = await submit(api, not_before="2020-01-01T00:00:00Z")
    clock.advance(0.001)
    third = await submit(api)
    assert [i["id"] for i in await claim(api, worker)] == [second["id"], third["id"]]
    clock.advance(59.998)
    assert [i["id"] for i in await claim(api, worker)] == [first["id"]]


async def test_a_batch_mixes_delays_and_keeps_its_order(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    worker = await hello(api, ["q"], capacity=10)
    items = [
        {"fn": "m:f", "args": [0], "delay_s": 10},
        {"fn": "m:f", "args": [1]},
        {"fn": "m:f", "args": [2], "delay_s": 10, "key": "k"},
        {"fn": "m:f", "args": [3], "delay_s": 20},
        {"fn": "m:f", "args": [4], "key": "k"},  # the key the delayed one holds
    ]
    answer = await api.post(f"{NS}/queues/q/invocations/batch", json={"invocations": items})
    assert answer.status_code == 201, answer.text
    made = answer.json()
    assert made["created"] == [True, True, True, True, False]
    ids = [i["id"] for i in made["invocations"]]
    assert ids[4] == ids[2]
    assert await stats(api) == (1, 3)
    assert [i["args"] for i in await claim(api, worker)] == [[1]]
    clock.advance(10)
    assert [i["args"] for i in await claim(api, worker)] == [[0], [2]]
    clock.advance(10)
    assert [i["args"] for i in await claim(api, worker)] == [[3]]


async def test_a_delayed_invocation_can_be_cancelled_before_it_is_due(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    worker = await hello(api, ["q"])
    later = await submit(api, delay_s=5)
    cancelled = await api.post(f"{NS}/invocations/{later['id']}/cancel")
    assert cancelled.json()["state"] == "cancelled"
    assert await stats(api) == (0, 0)
    clock.advance(5)
    assert await claim(api, worker) == []


async def test_a_deadline_counts_from_the_due_time(
    api: httpx.AsyncClient, store: Store, clock: FakeClock
) -> None:
    q = {"name": "q", "admission": {"deadline_cutoff_s": 10}}
    assert (await api.post(f"{NS}/queues", json=q)).status_code == 201
    kept = await submit(api, delay_s=60)
    clock.advance(1)
    dropped = await submit(api, delay_s=60)  # due at 61 s
    clock.advance(64)  # past its submit by more than the cutoff, within it of its due time
    assert (await reaper.reap(store, clock()))["expired"] == 0
    worker = await hello(api, ["q"], capacity=1)
    [got] = await claim(api, worker)
    assert got["id"] == kept["id"]
    clock.advance(7)  # now past its due time by more than the cutoff
    assert (await reaper.reap(store, clock()))["expired"] == 1
    late = (await api.get(f"{NS}/invocations/{dropped['id']}")).json()
    assert (late["state"], late["error"]["type"]) == ("expired", "DeadlineExpired")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"delay_s": 5, "not_before": "2026-01-01T12:00:05Z"}, None),
        ({"delay_s": -1}, "delay_s"),
        ({"delay_s": 365 * 86400 + 1}, "delay_s"),
        ({"not_before": "2027-01-01T12:00:01Z"}, "not_before"),  # the clock's 2026-01-01
        ({"not_before": "2026-01-01T12:00:05"}, "not_before"),
        ({"not_before": "soon"}, "not_before"),
    ],
)
async def test_a_delay_out_of_bounds_is_a_422_naming_it(
    api: httpx.AsyncClient, body: dict[str, Any], field: str | None
) -> None:
    await submit(api)  # the queue exists and is known: the one-statement door sees it first
    for path, sent, where in (
        ("invocations", {"fn": "m:f", **body}, field),
        (
            "invocations/batch",
            {"invocations": [{"fn": "m:f"}, {"fn": "m:f", **body}]},
            f"invocations[1].{field}" if field else "invocations[1]",
        ),
    ):
        answer = await api.post(f"{NS}/queues/q/{path}", json=sent)
        assert answer.status_code == 422, answer.text
        error = answer.json()["error"]
        assert error["code"] == "invalid"
        if where is not None:
            assert error["field"] == where, error
        assert "Traceback" not in answer.text
    assert await stats(api) == (1, 0)  # the refused batches wrote nothing


async def test_a_waiting_claim_is_not_handed_a_delayed_submit(
    quiet_api: httpx.AsyncClient, room: Waiting, clock: FakeClock
) -> None:
    """The hand-off asks the claim rule: a submit not due yet goes in pending, and the
    claim that was waiting takes it once it is due."""
    api = quiet_api
    worker = await hello(api, ["q"])
    await submit(api)  # makes the queue, known to the server from now on
    [first] = await claim(api, worker)
    await api.post(f"{W}/{worker}/invocations/{first['id']}/complete", json={"result": 1})
    waiting = await waiting_claim(api, room, worker, await queue_id_of(api, "q"), timeout_s=0.5)
    later = await submit(api, delay_s=30)
    assert (later["state"], later["worker"]) == ("pending", None)
    answer = await asyncio.wait_for(waiting, timeout=10)
    assert answer.json()["invocations"] == []
    clock.advance(30)
    [got] = await claim(api, worker)
    assert got["id"] == later["id"]


async def test_the_dashboard_shows_the_scheduled_count_beside_pending(
    api: httpx.AsyncClient, settings: Settings, clock: FakeClock
) -> None:
    await submit(api)
    await submit(api, delay_s=60)
    await submit(api, delay_s=60)
    cookies = httpx.Cookies()
    app = create_app(settings, clock=clock)
    async with (
        LifespanManager(app) as manager,
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=manager.app),
            base_url="http://lakeshore.test",
            cookies=cookies,
        ) as browser,
    ):
        await sign_in(browser, ADMIN_TOKEN)
        listing = await browser.get("/ui/ns/default/queues")
        row = r'data-queue="q".*?class="num pending">1 <small class="scheduled">\(\+2 scheduled\)'
        assert re.search(row, listing.text, re.S), listing.text
        page = await browser.get("/ui/ns/default/queues/q", headers={"HX-Request": "true"})
        assert re.search(r'id="q-scheduled">2<', page.text), page.text


async def test_an_empty_claim_does_not_wait_for_a_delayed_submit(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    """``next_in_s`` (what a --burst daemon waits for before it exits) leaves out work
    not due yet: a burst daemon runs what is queued, not what is scheduled."""
    worker = await hello(api, ["q"])
    await submit(api, delay_s=3600)
    empty = await api.post(f"{W}/{worker}/claim", json={"timeout_s": 0})
    assert empty.json() == {"invocations": [], "next_in_s": None}
    clock.advance(3600)
    due = await api.post(f"{W}/{worker}/claim", json={"timeout_s": 0})
    assert [i["state"] for i in due.json()["invocations"]] == ["running"]


async def test_metrics_count_a_delayed_submit_as_scheduled_until_due(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    await submit(api)
    await submit(api, delay_s=10)
    assert await queue_gauges(api) == (1.0, 1.0)
    clock.advance(10)  # past the scrape's one-second reuse too: the store is read again
    assert await queue_gauges(api) == (2.0, 0.0)


async def queue_gauges(api: httpx.AsyncClient) -> tuple[float, float]:
    """/metrics' pending and scheduled of queue q."""
    found = await scrape(api)
    return (queue_value(found, "pending", "q"), queue_value(found, "scheduled", "q"))
