"""``HEAD`` wherever ``GET`` is allowed.

FastAPI routes answer only the methods they declare, so ``HEAD /healthz`` was a 405.
Rather than declaring HEAD beside every GET (which would also double the published
schema), a HEAD request runs as the GET it mirrors and only the response's status and
headers go back — ``Content-Length`` included, as the GET's.

The GET runs to its end: it is never cut short, since cancelling a handler in the middle
of a database call can leave its connection unable to close. A route that streams asks
:func:`headers_only` and sends no items, so its HEAD ends at once.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

_HEAD = "lakeshore.head"


def headers_only(request: Request) -> bool:
    """Whether this GET answers a HEAD: its body will be dropped."""
    return bool(request.scope.get(_HEAD))


class HeadAsGet:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def without_body(message: Message) -> None:
            if message["type"] == "http.response.body":
                if message.get("more_body", False):
                    return
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        await self.app({**scope, "method": "GET", _HEAD: True}, receive, without_body)
