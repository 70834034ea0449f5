"""Prefetch: a worker may hold ``capabilities.prefetch`` invocations beyond its
``max_invocations`` (both stores), and a daemon with ``prefetch`` claims them ahead, runs
no more than its capacity at once, and hands back the ones it has not begun when it
stops."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from lakeshore.daemon.worker import Daemon
from tests.integration.daemons import NS, daemon_for


async def _hello(api: httpx.AsyncClient, queue: str, **capabilities: int) -> str:
    response = await api.post(
        "/v1/workers/hello", json={"queues": [queue], "capabilities": capabilities}
    )
    assert response.status_code == 200, response.text
    return str(response.json()["id"])


async def test_a_worker_holds_its_capacity_and_its_prefetch(api: httpx.AsyncClient) -> None:
    items = [{"fn": "tests.udfs:square", "args": [n]} for n in range(6)]
    made = await api.post(f"{NS}/queues/pf/invocations/batch", json={"invocations": items})
    assert made.status_code == 201, made.text
    ahead = await _hello(api, "pf", max_invocations=1, prefetch=2)
    plain = await _hello(api, "pf", max_invocations=1)
    claimed = await api.post(f"/v1/workers/{ahead}/claim", json={"timeout_s": 0, "max": 5})
    assert len(claimed.json()["invocations"]) == 3
    more = await api.post(f"/v1/workers/{ahead}/claim", json={"timeout_s": 0, "max": 5})
    assert more.json()["invocations"] == []  # it holds all it may
    one = await api.post(f"/v1/workers/{plain}/claim", json={"timeout_s": 0, "max": 5})
    assert len(one.json()["invocations"]) == 1
    refused = await api.post(
        "/v1/workers/hello", json={"queues": ["pf"], "capabilities": {"prefetch": -1}}
    )
    assert refused.status_code == 422


def _as_daemon(transport: httpx.AsyncBaseTransport, daemon: Daemon) -> httpx.AsyncClient:
    """A client of the app with the daemon's token."""
    return httpx.AsyncClient(
        transport=transport,
        base_url="http://lakeshore.test",
        headers={"Authorization": f"Bearer {daemon.config.token}"},
    )


async def _states(http: httpx.AsyncClient, queue: str) -> dict[str, int]:
    stats = await http.get(f"{NS}/queues/{queue}/stats")
    return dict(stats.json()["byState"])


async def test_a_daemon_prefetches_runs_its_capacity_and_hands_back_the_rest_at_stop(
    app_transport: httpx.AsyncBaseTransport, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    daemon = daemon_for(app_transport, "ahead")
    daemon.config.capacity, daemon.config.prefetch, daemon.config.burst = 1, 2, False
    async with _as_daemon(app_transport, daemon) as http:
        items = [{"fn": "tests.udfs_pool:wait_for_file", "args": [str(gate)]}] * 4
        made = await http.post(f"{NS}/queues/ahead/invocations/batch", json={"invocations": items})
        assert made.status_code == 201, made.text
        run = asyncio.create_task(daemon.run())
        try:
            for _ in range(600):  # bounded: at most a minute
                held = (await _states(http, "ahead")).get("running")
                if held == 3 and len(daemon.prefetched) == 2:  # the daemon has them too
                    break
                await asyncio.sleep(0.1)
            states = await _states(http, "ahead")
            assert (states.get("running"), states.get("pending")) == (3, 1)
            assert len(daemon.prefetched) == 2  # held, waiting for the one slot
            daemon.stop.set()
            await asyncio.sleep(0.2)
            gate.touch()  # the one begun may finish
            assert await asyncio.wait_for(run, 60) == 0
        finally:
            gate.touch()
            daemon.stop.set()
            await asyncio.gather(run, return_exceptions=True)
        states = await _states(http, "ahead")
    assert (states.get("succeeded"), states.get("pending"), states.get("running", 0)) == (1, 3, 0)
    assert daemon.completed == 1


class _HeldReports(httpx.AsyncBaseTransport):
    """The app's transport, with every report of outcomes held until ``release``."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.release = asyncio.Event()
        self.held = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/results"):
            self.held += 1
            await self.release.wait()
        return await self.inner.handle_async_request(request)


async def test_a_prefetched_invocation_starts_while_the_last_ones_report_is_on_its_way(
    app_transport: httpx.AsyncBaseTransport, tmp_path: Path
) -> None:
    """A slot is free once its run has ended, not once the report's answer is back: with
    the reports held, the prefetched invocation still runs."""
    held = _HeldReports(app_transport)
    record = tmp_path / "ran"
    daemon = daemon_for(held, "slots")
    daemon.config.capacity, daemon.config.prefetch, daemon.config.burst = 1, 1, False
    async with _as_daemon(app_transport, daemon) as http:
        items = [{"fn": "tests.udfs:record", "args": [str(record), n]} for n in (1, 2)]
        made = await http.post(f"{NS}/queues/slots/invocations/batch", json={"invocations": items})
        assert made.status_code == 201, made.text
        run = asyncio.create_task(daemon.run())
        try:
            for _ in range(600):  # bounded: at most a minute
                if record.exists() and len(record.read_text().split()) == 2:
                    break
                await asyncio.sleep(0.1)
            assert sorted(record.read_text().split()) == ["1", "2"]  # both ran...
            states = await _states(http, "slots")
            assert states.get("running") == 2  # ...and neither report has been recorded
            assert held.held >= 1
            held.release.set()
            for _ in range(600):
                if (await _states(http, "slots")).get("succeeded") == 2:
                    break
                await asyncio.sleep(0.1)
        finally:
            held.release.set()
            daemon.stop.set()
            await asyncio.gather(run, return_exceptions=True)
        assert (await _states(http, "slots")).get("succeeded") == 2
