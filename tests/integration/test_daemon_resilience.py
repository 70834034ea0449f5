"""The daemon rides out a server that is restarting, overloaded or briefly without its
store: refused or failed requests are retried, and nothing it ran is lost."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import psutil
import pytest

from lakeshore import transport
from lakeshore.daemon import runner
from tests.conftest import ADMIN, FakeClock
from tests.integration.daemons import NS, Flaky, alive, daemon_for, eventually, results, submit


async def test_refused_claims_and_reports_are_retried(
    app_transport: httpx.AsyncBaseTransport,
) -> None:
    await submit(app_transport, "flaky", 4)
    flaky = Flaky(app_transport, {"/claim": (503, 3), "/results": (500, 2)})
    daemon = daemon_for(flaky, "flaky")

    assert await daemon.run() == 0

    assert flaky.seen == {"/claim": 3, "/results": 2}
    assert await results(app_transport, "flaky") == [("succeeded", n * n) for n in range(4)]
    assert daemon.completed == 4


async def test_a_daemon_driven_on_a_callers_loop_leaves_its_signals_alone(
    app_transport: httpx.AsyncBaseTransport,
) -> None:
    """Only ``lakeshore daemon run`` takes SIGTERM/SIGINT: a daemon run on a test's loop
    that took them would make the test's process deaf to ``timeout``."""
    await submit(app_transport, "signals", 1)
    assert await daemon_for(app_transport, "signals").run() == 0
    loop = asyncio.get_running_loop()
    assert not loop.remove_signal_handler(signal.SIGTERM)
    assert not loop.remove_signal_handler(signal.SIGINT)


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

    with pytest.raises(transport.Unreachable, match="ConnectError"):
        await daemon.run()
    assert flaky.seen["/hello"] == 3
    # its children started up during the hello, and none outlives it
    assert isinstance(daemon.runner, runner.Processes)
    pool = daemon.runner.pool
    assert pool.started == daemon.config.capacity
    assert pool.closed
    assert pool.children == []
    assert not [p for p in psutil.Process().children() if "lakeshore.daemon.child" in p.cmdline()]


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
        # served (its leases taken at the clock's time), then its answer lost
        await eventually(lambda: flaky.lost["/claim"] == 1, "the lost answer")
        clock.advance(1)  # past a lease (0.3 s) since that claim
        await eventually(lambda: daemon.completed == 3, "all three to run")
    finally:
        daemon.stop.set()
        assert await asyncio.wait_for(running, 30) == 0
    assert await results(app_transport, "answer-lost") == [("succeeded", n * n) for n in range(3)]


async def test_a_report_answered_with_garbage_runs_again_after_a_lease(
    app_transport: httpx.AsyncBaseTransport, clock: FakeClock
) -> None:
    """Nothing was recorded and the daemon cannot tell: it stops waiting on that report,
    its heartbeats stop listing the invocation, and the server hands it back to run again;
    later reports go on as usual."""
    await submit(app_transport, "garbage", 1)
    flaky = Flaky(app_transport, {"/results": (200, 1)})
    daemon = daemon_for(flaky, "garbage")
    daemon.config.burst = False
    daemon.config.claim_timeout_s = 1
    running = asyncio.create_task(daemon.run())
    try:
        await eventually(lambda: flaky.seen["/results"] == 1, "the garbled answer")
        await eventually(lambda: not daemon.running, "the report to be given up")
        clock.advance(1)  # past a lease since the claim
        await eventually(lambda: daemon.completed == 1, "the invocation to run again")
    finally:
        daemon.stop.set()
        assert await asyncio.wait_for(running, 30) == 0
    assert await results(app_transport, "garbage") == [("succeeded", 0)]


class HeldHeartbeat(httpx.AsyncBaseTransport):
    """The API in-process; the first heartbeat's answer, once the server has sent it,
    waits for ``meanwhile`` (a claim answered while the heartbeat is on its way)."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.meanwhile: Callable[[], Awaitable[None]] | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.url.path.endswith("/heartbeat") and self.meanwhile is not None:
            meanwhile, self.meanwhile = self.meanwhile, None
            await meanwhile()
        return response


async def test_work_claimed_while_a_heartbeat_is_on_its_way_is_not_cancelled(
    app_transport: httpx.AsyncBaseTransport,
) -> None:
    """The heartbeat's answer cannot list a lease taken after the server looked: the
    daemon keeps running it."""
    held = HeldHeartbeat(app_transport)
    daemon = daemon_for(held, "beat-race")
    daemon.config.burst = False

    async def claim_meanwhile() -> None:
        async with httpx.AsyncClient(
            transport=app_transport, base_url="http://lakeshore.test", headers=ADMIN
        ) as http:
            body = {"fn": "tests.udfs:sleep", "args": [0.5]}
            await http.post(f"{NS}/queues/beat-race/invocations", json=body)
        await eventually(lambda: bool(daemon.running), "the daemon to claim it")

    held.meanwhile = claim_meanwhile
    running = asyncio.create_task(daemon.run())
    try:
        await eventually(lambda: daemon.completed == 1, "the invocation to run to the end")
    finally:
        daemon.stop.set()
        assert await asyncio.wait_for(running, 30) == 0
    assert held.meanwhile is None  # the race was staged
    assert await results(app_transport, "beat-race") == [("succeeded", 0.5)]
