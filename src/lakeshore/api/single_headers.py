"""One ``Authorization`` and one ``Content-Type`` a request, or a 400.

HTTP lets a header name repeat, and readers disagree on which one counts: Starlette's
``request.headers[...]`` takes the first, a second submit door (since removed) read the
last, a proxy in front may take either or join them. Two ``Authorization`` headers, junk
then a valid token, were a 201 at that door and a 401 on the route; a proxy that checks
one and a server that uses the other is how a request gets past the check. Neither
header has a meaning when repeated, so a request that repeats one is refused, 400
``bad_request`` in the API's error shape, on every route, before routing.

The check is one walk over the scope's header pairs (lower-case bytes, as ASGI gives
them), nothing decoded: about 0.5 µs for a request of five or ten headers on the 2-core
bench machine (``timeit``, the call's own overhead taken off).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from lakeshore.api.errors import error_response


def duplicated(scope: Scope) -> str | None:
    """``Authorization`` or ``Content-Type``, whichever the request sends a second time
    first, or ``None``."""
    authorization = content_type = False
    for name, _ in scope["headers"]:
        if name == b"authorization":
            if authorization:
                return "Authorization"
            authorization = True
        elif name == b"content-type":
            if content_type:
                return "Content-Type"
            content_type = True
    return None


class SingleHeaders:
    """Refuse a request that repeats ``Authorization`` or ``Content-Type`` (400
    ``bad_request``, the header named in ``field``, its values never quoted: one may be
    a token)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        name = duplicated(scope) if scope["type"] == "http" else None
        if name is None:
            await self.app(scope, receive, send)
            return
        message = f"the request has more than one {name} header; send one"
        response = error_response(400, "bad_request", message, name.lower())
        await response(scope, receive, send)
