"""The daemon rides out a server that is restarting, overloaded or briefly without its
store: refused or failed requests are retried, and nothing it ran is lost."""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest
from asgi_lifespan import LifespanManager

from lakeshore.api.app import create_app
from lakeshore.config import Settings
from lakeshore.daemon.worker import Daemon, DaemonConfig
from tests.conftest import ADMIN, ADMIN_TOKEN, FakeClock

NS = "/v1/namespaces/default"


class Flaky(httpx.AsyncBaseTransport):
    """The API in-process, failing the first requests to chosen routes: a route ending
    in ``suffix`` fails ``times`` times with ``status`` (0: the connection is refused;
    -1: the request is served and its answer lost)."""

    def __init__(self, inner: httpx.AsyncBaseTransport, faults: dict[str, tuple[int, int]]):
        self.inner = inner
        self.faults = dict(faults)
        self.seen: Counter[str] = Counter()
        self.bodies: list[tuple[str, bytes]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.bodies.append((request.url.path, await request.aread()))
        for suffix, (status, times) in self.faults.items():
            if request.url.path.endswith(suffix) and self.seen[suffix] < times:
                self.seen[suffix] += 1
                if status == 0:
                    raise httpx.ConnectError("connection refused", request=request)
                if status == -1:  # the server acts on it, and dies as it answers
                    await self.inner.handle_async_request(request)
                    raise httpx.RemoteProtocolError("server disconnected", request=request)
                return httpx.Response(status, json={"error": {"message": "not now"}})
        return await self.inner.handle_async_request(request)


@pytest.fixture
async def app_transport(
    settings: Settings, clock: FakeClock
) -> AsyncIterator[httpx.AsyncBaseTransport]:
    # short leases, so daemons heartbeat every 0.1 s (the fake clock expires none)
    app = create_app(settings.model_copy(update={"lease_s": 0.3}), clock=clock)
    async with LifespanManager(app) as manager:
        yield httpx.ASGITransport(app=manager.app)


async def submit(transport: httpx.AsyncBaseTransport, queue: str, count: int) -> None:
    async with httpx.AsyncClient(
        transport=transport, base_url="http://lakeshore.test", headers=ADMIN
    ) as http:
        items = [{"fn": "tests.udfs:square", "args": [n]} for n in range(count)]
        response = await http.post(
            f"{NS}/queues/{queue}/invocations/batch", json={"invocations": items}
        )
        assert response.status_code == 201, response.text


async def results(transport: httpx.AsyncBaseTransport, queue: str) -> list[tuple[str, object]]:
    async with httpx.AsyncClient(
        transport=transport, base_url="http://lakeshore.test", headers=ADMIN
    ) as http:
        page = (await http.get(f"{NS}/queues/{queue}/invocations", params={"limit": 100})).json()
        return sorted((i["state"], i["result"]) for i in page["invocations"])


def daemon_for(transport: httpx.AsyncBaseTransport, queue: str) -> Daemon:
    config = DaemonConfig(
        server="http://lakeshore.test",
        token=ADMIN_TOKEN,
        queues=[queue],
        capacity=2,
        burst=True,
        retry_s=0.01,
        transport=transport,
    )
    return Daemon(config)


async def test_refused_claims_and_reports_are_retried(
    app_transport: httpx.AsyncBaseTransport,
) -> None:
    await submit(app_transport, "flaky", 4)
    flaky = Flaky(app_transport, {"/claim": (503, 3), "/complete": (500, 2)})
    daemon = daemon_for(flaky, "flaky")

    assert await daemon.run() == 0

    assert flaky.seen == {"/claim": 3, "/complete": 2}
    assert daemon.completed == 4
    assert await results(app_transport, "flaky") == [("succeeded", n * n) for n in range(4)]


async def test_hello_waits_for_a_server_that_is_still_starting(
    app_transport: httpx.AsyncBaseTransport,
) -> None:
    await submit(app_transport, "starting", 2)
    flaky = Flaky(app_transport, {"/hello": (0, 2), "/claim": (429, 1)})
    daemon = daemon_for(flaky, "starting")

    assert await daemon.run() == 0

    assert flaky.seen == {"/hello": 2, "/claim": 1}
    assert await results(app_transport, "starting") == [("succeeded", 0), ("succeeded", 1)]


async def test_a_worker_the_server_forgot_says_hello_again_with_its_id(
    app_transport: httpx.AsyncBaseTransport,
) -> None:
    await submit(app_transport, "forgot", 2)
    flaky = Flaky(app_transport, {"/claim": (404, 1)})
    daemon = daemon_for(flaky, "forgot")

    assert await daemon.run() == 0

    hellos = [json.loads(body) for path, body in flaky.bodies if path.endswith("/hello")]
    assert len(hellos) == 2
    assert "id" not in hellos[0]
    assert hellos[1]["id"] == daemon.worker_id
    assert await results(app_transport, "forgot") == [("succeeded", 0), ("succeeded", 1)]


async def test_hello_gives_up_after_its_attempts(
    app_transport: httpx.AsyncBaseTransport,
) -> None:
    flaky = Flaky(app_transport, {"/hello": (0, 100)})
    daemon = daemon_for(flaky, "never")
    daemon.config.hello_attempts = 3

    with pytest.raises(httpx.ConnectError):
        await daemon.run()
    assert flaky.seen["/hello"] == 3


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def eventually(predicate: Callable[[], bool], what: str, within_s: float = 20) -> None:
    for _ in range(int(within_s / 0.05)):
        if predicate():
            return
        await asyncio.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


async def test_a_lost_lease_kills_the_child_running_it(
    app_transport: httpx.AsyncBaseTransport, tmp_path: Path
) -> None:
    """Cancelled (or re-dispatched) elsewhere: the daemon learns it at its next heartbeat
    and stops the child, rather than letting it run on for an invocation it lost."""
    pid_file = tmp_path / "pid"
    async with httpx.AsyncClient(
        transport=app_transport, base_url="http://lakeshore.test", headers=ADMIN
    ) as http:
        body = {"fn": "tests.udfs:pid_then_sleep", "args": [str(pid_file), 120]}
        submitted = (await http.post(f"{NS}/queues/lost/invocations", json=body)).json()
        daemon = daemon_for(app_transport, "lost")
        daemon.config.burst = False
        running = asyncio.create_task(daemon.run())
        try:
            await eventually(pid_file.exists, "the child to start")
            await eventually(lambda: pid_file.read_text() != "", "the child's pid")
            pid = int(pid_file.read_text())
            assert alive(pid)
            cancel = await http.post(f"{NS}/invocations/{submitted['id']}/cancel")
            assert cancel.status_code == 200, cancel.text
            await eventually(lambda: not alive(pid), "the child to be killed")
        finally:
            daemon.stop.set()
            assert await asyncio.wait_for(running, 30) == 0
        assert daemon.completed == 0


async def test_invocations_whose_claim_answer_was_lost_run_after_a_lease(
    app_transport: httpx.AsyncBaseTransport, clock: FakeClock
) -> None:
    """The server leased them to this daemon and died as it answered: the daemon's
    heartbeats say it does not run them, so once a lease has passed they go back to the
    queue, and it claims and runs them."""
    await submit(app_transport, "answer-lost", 3)
    flaky = Flaky(app_transport, {"/claim": (-1, 1)})
    daemon = daemon_for(flaky, "answer-lost")
    daemon.config.burst = False
    daemon.config.claim_timeout_s = 1
    running = asyncio.create_task(daemon.run())
    try:
        await eventually(lambda: flaky.seen["/claim"] == 1, "the lost answer")
        clock.advance(1)  # past a lease (0.3 s) since that claim
        await eventually(lambda: daemon.completed == 3, "all three to run")
    finally:
        daemon.stop.set()
        assert await asyncio.wait_for(running, 30) == 0
    assert await results(app_transport, "answer-lost") == [("succeeded", n * n) for n in range(3)]
