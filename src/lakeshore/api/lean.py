"""Routes that read their own request when it is the one every caller sends.

A submit is the request a user's code makes per call, and FastAPI's handling of it
(reading the body and its content type, solving the dependencies one by one, checking
the query against its declarations) was a fifth of its time on the server. A route
made with :func:`route` keeps its declared signature, which the schema documents and
the framework reads, and adds a *reader*: a coroutine that takes the request and
returns the endpoint's arguments, or ``None`` when the request is not one it reads as
the framework would (a query it does not know, another content type, a body that is
not JSON). Then the framework's own handler reads it, with its words for any refusal.
Either way the same endpoint runs, inside the same error handling: what a reader
raises (a token that opens nothing, a namespace not found) is answered as the same
error raised by a dependency would be.

The routers of the hot paths are each a :class:`Router`, which tells a path outside its
prefix that none of its routes matches at once, where FastAPI tries each of them in
turn (a submit passed the nine worker routes before its own, some 15 µs of a 0.5 ms
request).

Where it lives: :func:`route` (the route class), :func:`json_body` and :func:`query`
(what readers share), the readers beside their routes (``routes/invocations.py``),
:class:`Router` (``routes/workers.py``, ``routes/invocations.py``).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Final

from fastapi import HTTPException, Request, Response
from fastapi.routing import APIRoute, APIRouter
from starlette.requests import ClientDisconnect
from starlette.routing import Match
from starlette.types import Scope

from lakeshore import jsontext

Reader = Callable[[Request], Awaitable[dict[str, Any] | None]]
Handler = Callable[[Request], Coroutine[Any, Any, Response]]
UNREAD: Final = object()  # a body the framework reads (and refuses) itself


def route(reader: Reader) -> type[APIRoute]:
    """A route class whose requests ``reader`` reads, where it can (for
    ``APIRouter.add_api_route(route_class_override=…)``)."""

    class LeanRoute(APIRoute):
        def get_route_handler(self) -> Handler:
            framework = super().get_route_handler()
            endpoint = self.endpoint

            async def handler(request: Request) -> Response:
                arguments = await reader(request)
                if arguments is None:
                    return await framework(request)
                answer: Response = await endpoint(**arguments)
                return answer

            return handler

    return LeanRoute


_JSON = b"application/json"


async def json_body(request: Request) -> Any:
    """The request's body, read once, as the framework reads a JSON body (an integer
    past 64 bits stays an integer: :func:`lakeshore.jsontext.parsed`), or
    :data:`UNREAD`: no body, another content type, not JSON, or JSON ``null`` (which
    the framework reads as no body)."""
    content_type = None
    for name, value in request.scope["headers"]:
        if name == b"content-type":
            content_type = value
            break
    if content_type != _JSON:
        return UNREAD
    try:
        raw = await request.body()  # kept on the request: the framework reads it from there
    except ClientDisconnect:  # gone mid-body (its 408 was sent): refused as the framework would
        raise HTTPException(400, "the client went away before its body was read") from None
    if not raw:
        return UNREAD
    try:
        body = jsontext.parsed(raw)
    except (ValueError, RecursionError):
        return UNREAD
    return UNREAD if body is None else body


QueryValue = Callable[[bytes], Any]


def query(raw: bytes, known: Mapping[str, QueryValue]) -> dict[str, Any] | None:
    """The query string's parameters, each read by its reader in ``known``, or ``None``
    when a parameter is unknown, repeated, percent-encoded, or its reader returns
    ``None`` (the framework reads such a query, and refuses what it refuses)."""
    read: dict[str, Any] = {}
    if not raw:
        return read
    for pair in raw.split(b"&"):
        name, _, value = pair.partition(b"=")
        key = name.decode("latin-1")
        reader = known.get(key)
        if reader is None or key in read or b"%" in pair or b"+" in pair:
            return None
        parsed = reader(value)
        if parsed is None:
            return None
        read[key] = parsed
    return read


_SECONDS = re.compile(rb"[0-9]{1,2}(?:\.[0-9]{1,6})?")


def seconds_within(most: float) -> QueryValue:
    """A reader of a plain decimal number of seconds from 0 to ``most``."""

    def read(value: bytes) -> float | None:
        if _SECONDS.fullmatch(value) is None:
            return None
        seconds = float(value)
        return seconds if seconds <= most else None

    return read


def one_of(*choices: str) -> QueryValue:
    """A reader of one of ``choices``, as text."""
    known = {choice.encode(): choice for choice in choices}
    return known.get


class Router(APIRouter):
    """An ``APIRouter`` that answers "no match" at once for a path outside the literal
    part of its prefix (up to its first path parameter)."""

    def __init__(self, *, prefix: str, **options: Any) -> None:
        super().__init__(prefix=prefix, **options)
        self.literal_prefix = prefix.split("{", 1)[0]

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        path: str = scope["path"]
        root: str = scope.get("root_path", "")
        if root and path.startswith(root):  # mounted: routes see the path below the mount
            path = path[len(root) :]
        if not path.startswith(self.literal_prefix):
            return Match.NONE, {}
        return super().matches(scope)
