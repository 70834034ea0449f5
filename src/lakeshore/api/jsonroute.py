"""Routes whose JSON bodies are read by orjson, to the values Python's json would read.

FastAPI reads a route's JSON body with ``Request.json``, which is Python's json module: a
tenth of a batch submit's time on the server, and as much of a daemon's report of
hundreds of outcomes. :class:`JsonRoute` hands the route a request whose ``json`` reads
the body through :func:`lakeshore.jsontext.parsed` (orjson where the two modules read
the text alike, Python's json otherwise), so a route sees the same values, and text that
is not JSON fails as before (``json.JSONDecodeError``, answered 422 by the framework).
The hot routers (invocations, workers) take it as their ``route_class``.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from lakeshore import jsontext


class JsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = jsontext.parsed(await self.body())
        return self._json


class JsonRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            return await handler(JsonRequest(request.scope, request.receive))

        return route
