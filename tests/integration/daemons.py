"""Driving a real :class:`~lakeshore.daemon.worker.Daemon` against the API in-process
(the ``app_transport`` fixture, in ``conftest.py``), with faults injected on chosen
routes."""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import Callable

import httpx
import pytest

from lakeshore.daemon.worker import Daemon, DaemonConfig
from tests.conftest import ADMIN, ADMIN_TOKEN

NS = "/v1/namespaces/default"


class Flaky(httpx.AsyncBaseTransport):
    """The API in-process, failing the first requests to chosen routes: a route ending
    in ``suffix`` fails ``times`` times with ``status`` (0: the connection is refused;
    -1: the request is served and its answer lost; 200: an answer that is not the API's)."""

    def __init__(self, inner: httpx.AsyncBaseTransport, faults: dict[str, tuple[int, int]]):
        self.inner = inner
        self.faults = dict(faults)
        self.seen: Counter[str] = Counter()
        self.lost: Counter[str] = Counter()  # served, then the answer lost (status -1)
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
                    self.lost[suffix] += 1
                    raise httpx.RemoteProtocolError("server disconnected", request=request)
                if status == 200:  # something between answers for the server: garbage
                    return httpx.Response(200, text="<html>proxy says hi</html>")
                return httpx.Response(status, json={"error": {"message": "not now"}})
        return await self.inner.handle_async_request(request)


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
