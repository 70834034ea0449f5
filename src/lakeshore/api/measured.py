"""Count and time every HTTP request by route template (``/v1/workers/{worker_id}/claim``,
never the ids in it), method and status, for ``GET /metrics``."""

from __future__ import annotations

import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from lakeshore.services.metrics import Metrics

UNMATCHED = "(unmatched)"  # no route: one label for every unknown path


class Measured:
    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics
        self.series = Series(metrics)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()
        status = 500  # what a server that never answered amounts to

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = getattr(scope.get("route"), "path", None) or UNMATCHED
            self.series.record(scope["method"], route, status, began)


class Series:
    """The request counter's and the duration histogram's series, each looked up by its
    labels once: the client library's lookup takes a lock and checks the labels on
    every call, a few microseconds on every request."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._counted: dict[tuple[str, str, int], Any] = {}
        self._timed: dict[tuple[str, str], Any] = {}

    def record(self, method: str, route: str, status: int, began: float) -> None:
        """Count an answered request, and the time since ``began`` (``time.perf_counter``)."""
        counted = self._counted.get((method, route, status))
        if counted is None:
            counted = self.metrics.http_requests.labels(method, route, str(status))
            self._counted[(method, route, status)] = counted
        timed = self._timed.get((method, route))
        if timed is None:
            timed = self._timed[(method, route)] = self.metrics.http_seconds.labels(method, route)
        counted.inc()
        timed.observe(time.perf_counter() - began)
