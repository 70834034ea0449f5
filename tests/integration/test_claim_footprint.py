"""What a waiting long-poll claim keeps alive in the server, and the memory handed back
once a burst of them has ended (api/routes/workers.py, services/taskqueue/notify.py).

A server holding hundreds of waiting claims holds each one's objects for up to 20 s, and
its memory grows to their high-water mark (``bench/longpoll_memory.py``). Here, through
the API on both stores: a waiting claim runs in its request's task alone (no task of its
own watches for the client's hang-up), and the end of a burst of claims releases memory
once, not while claims still wait.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI

from lakeshore.api.app import create_app
from lakeshore.api.routes import workers as workers_route
from lakeshore.config import Settings
from lakeshore.services.taskqueue.notify import AfterBursts, Bell, HangupWatch
from tests.conftest import ADMIN, FakeClock

NS = "/v1/namespaces/default"
W = "/v1/workers"
CLAIMS = 8


@dataclass
class Served:
    app: FastAPI
    api: httpx.AsyncClient


@pytest.fixture
async def served(settings: Settings, clock: FakeClock) -> AsyncIterator[Served]:
    app = create_app(settings, clock=clock)
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://lakeshore.test", headers=ADMIN
        ) as api:
            yield Served(app, api)


async def workers(api: httpx.AsyncClient, n: int) -> list[str]:
    made = await api.post(f"{NS}/queues", json={"name": "q"})
    assert made.status_code == 201, made.text
    hello = {"queues": ["q"], "capabilities": {"max_invocations": 1}}
    return [(await api.post(f"{W}/hello", json=hello)).json()["id"] for _ in range(n)]


async def until(done: Callable[[], bool], what: str) -> None:
    for _ in range(1000):  # bounded: until the server has got there
        if done():
            return
        await asyncio.sleep(0.01)
    pytest.fail(what)


def claims(api: httpx.AsyncClient, ids: list[str]) -> list[asyncio.Task[httpx.Response]]:
    body = {"timeout_s": 20, "max": 1}
    return [asyncio.create_task(api.post(f"{W}/{w}/claim", json=body)) for w in ids]


async def test_a_waiting_claim_has_no_task_of_its_own(served: Served) -> None:
    """Each waiting claim is one task here: the client's, which runs the app (through
    ASGI). A task per claim to watch for its hang-up made two for each."""
    ids = await workers(served.api, CLAIMS)
    notifier = served.app.state.lakeshore.notifier
    before = asyncio.all_tasks()
    waiting = claims(served.api, ids)
    await until(lambda: notifier.waiting() == CLAIMS, "the claims never all waited")
    # beside the claims' own, at most the store's housekeeping (the pool closing a
    # connection): never one for each claim
    others = [t.get_coro() for t in asyncio.all_tasks() - before - set(waiting)]
    assert len(others) < CLAIMS, others

    batch = [{"fn": "m:f", "args": [i]} for i in range(CLAIMS)]
    sent = await served.api.post(f"{NS}/queues/q/invocations/batch", json={"invocations": batch})
    assert sent.status_code == 201, sent.text
    answers = await asyncio.gather(*waiting)
    got = sorted(a.json()["invocations"][0]["args"][0] for a in answers)
    assert got == list(range(CLAIMS))  # each waiting claim was handed one
    assert notifier.waiting() == 0


async def test_the_end_of_a_burst_of_claims_releases_memory_once(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    released: list[int] = []
    notifier = served.app.state.lakeshore.notifier
    after = AfterBursts(
        least=CLAIMS, delay_s=0, min_gap_s=3600, release=lambda: released.append(notifier.waiting())
    )
    monkeypatch.setattr(workers_route, "after_bursts", after)
    ids = await workers(served.api, CLAIMS)
    waiting = claims(served.api, ids)
    await until(lambda: notifier.waiting() == CLAIMS, "the claims never all waited")
    assert released == []  # not while they wait
    sent = await served.api.post(
        f"{NS}/queues/q/invocations/batch",
        json={"invocations": [{"fn": "m:f"} for _ in range(CLAIMS)]},
    )
    assert sent.status_code == 201, sent.text
    await asyncio.gather(*waiting)
    await until(lambda: released != [], "no release after the burst")
    [still_waiting] = released  # once, when at most a quarter of the claims were left
    assert still_waiting <= CLAIMS // 4
    # a second burst within min_gap_s: no release
    waiting = claims(served.api, ids)
    await until(lambda: notifier.waiting() == CLAIMS, "the claims never all waited")
    for worker in list(served.app.state.lakeshore.hangups):
        worker.set()  # as the server's stop does: each answers at once, empty
    assert all(a.json()["invocations"] == [] for a in await asyncio.gather(*waiting))
    assert released == [still_waiting]


def test_a_release_waits_for_the_burst_to_end_and_for_the_gap() -> None:
    """The decision alone (no loop): a quarter of the highest count, at least ``least``."""
    after = AfterBursts(least=4, release=lambda: None)
    after._now, after._peak = 3, 3
    assert not after._ended()  # never ``least`` at once
    after._now, after._peak = 2, 8
    assert after._ended()
    after._now = 3
    assert not after._ended()  # more than a quarter still in progress


async def test_the_hangup_watch_sets_gone_on_disconnect_and_lets_go_when_closed() -> None:
    """The watch steps ``receive`` as a task would: through body messages and waits,
    until the disconnect; closed early, it leaves nothing waiting."""
    from lakeshore.services.taskqueue.notify import Hangup

    arrived = Bell()
    messages = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive() -> dict[str, object]:
        if messages:
            return messages.pop()
        await asyncio.sleep(0)
        await arrived.wait()
        return {"type": "http.disconnect"}

    gone = Hangup()
    HangupWatch(receive, gone)
    await until(lambda: len(arrived._waiters) == 1, "the watch never waited")
    assert not gone.is_set()
    arrived.set()
    await until(gone.is_set, "the disconnect was not noticed")

    arrived.clear()
    kept = Hangup()
    watch = HangupWatch(receive, kept)
    await until(lambda: len(arrived._waiters) == 1, "the watch never waited")
    watch.close()
    assert arrived._waiters == []
    arrived.set()
    await asyncio.sleep(0)
    assert not kept.is_set()
