"""Count and time every HTTP request by route template (``/v1/workers/{worker_id}/claim``,
never the ids in it), method and status, for ``GET /metrics``."""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from lakeshore.services.metrics import Metrics

UNMATCHED = "(unmatched)"  # no route: one label for every unknown path


class Measured:
    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

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
            record(self.metrics, scope["method"], route, status, began)


def record(metrics: Metrics, method: str, route: str, status: int, began: float) -> None:
    """Count an answered request, and the time since ``began`` (``time.perf_counter``)."""
    metrics.http_requests.labels(method, route, str(status)).inc()
    metrics.http_seconds.labels(method, route).observe(time.perf_counter() - began)
