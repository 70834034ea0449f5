"""Text-only request lines: the path, the query string and the headers the API reads.

Every id and name a route takes arrives in the path or the query string, and reaches the
store as text. PostgreSQL keeps NUL in no text (a query holding one fails), and bytes that
are not UTF-8 — a lone surrogate's encoding among them — are no text at all: the framework
would silently turn them into U+FFFD. So one guard, before routing, refuses what holds a
NUL or, percent-decoded, is not UTF-8, each the way the API already refuses that place:

- the path: 404 ``not_found``, as for any other id or name no record can have;
- a query parameter (its name or value): 422 ``invalid``, ``field`` the parameter;
- ``Authorization``: 401 ``unauthorized``, a token that opens nothing;
- ``Last-Event-ID``: 422 ``invalid``, ``field`` ``last-event-id``;
- ``Content-Type``: 400 ``bad_request`` (a bad ``Content-Length`` is
  :class:`~lakeshore.api.limits.BodySizeLimit`'s).

Checking here, rather than in each route, covers the routes still to come too. What a
body holds is checked where it is parsed (``jsonsafe.require_storable`` and the request
models' ``jsonsafe.StorableText``); JSON inside ``args``, ``kwargs`` and results is the
user's data, refused only when no store could keep it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final
from urllib.parse import unquote_to_bytes

from starlette.types import ASGIApp, Receive, Scope, Send

from lakeshore.api.errors import error_response

# the headers a route or a dependency reads, and how each refuses a value (a token that
# opens nothing is refused as every other is, in the same words)
READ_HEADERS: Final = {
    b"authorization": (401, "unauthorized", "invalid or missing token"),
    b"last-event-id": (422, "invalid", None),
    b"content-type": (400, "bad_request", None),
}


@dataclass(frozen=True)
class Refusal:
    status: int
    code: str
    message: str
    field: str | None = None


def _text_problem(raw: bytes) -> str | None:
    """Why percent-decoded ``raw`` is not text a store can keep, if it is not."""
    if b"\x00" in raw:
        return "holds a NUL character"
    try:
        raw.decode("utf-8")  # strict: an encoded lone surrogate is refused too
    except UnicodeDecodeError:
        return "is not UTF-8 text"
    return None


def _path_problem(scope: Scope) -> str | None:
    raw_path = scope.get("raw_path")
    if raw_path is not None:
        return _text_problem(unquote_to_bytes(raw_path))
    path: str = scope["path"]  # a server that gives no raw path has decoded it already
    return _text_problem(path.encode("utf-8", "surrogatepass"))


def _query_problem(query: bytes) -> tuple[str, str] | None:
    """``(parameter, problem)`` for the first query parameter that is not text."""
    for pair in query.split(b"&"):
        name, _, value = pair.partition(b"=")
        raw_name = unquote_to_bytes(name.replace(b"+", b" "))
        for part in (raw_name, unquote_to_bytes(value.replace(b"+", b" "))):
            problem = _text_problem(part)
            if problem is not None:
                return raw_name.decode("utf-8", "replace").replace("\x00", "\\0"), problem
    return None


def refusal(scope: Scope) -> Refusal | None:
    """How to refuse the request, if its path, query or a read header is not text."""
    problem = _path_problem(scope)
    if problem is not None:
        return Refusal(404, "not_found", f"the path {problem}: no record has such an id or name")
    query = scope.get("query_string") or b""
    found = _query_problem(query) if query else None
    if found is not None:
        name, problem = found
        return Refusal(422, "invalid", f"{name}: the query value {problem}", name)
    for header, value in scope.get("headers", ()):
        if header in READ_HEADERS and b"\x00" in value:
            status, code, words = READ_HEADERS[header]
            name = header.decode("latin-1")
            if words is not None:
                return Refusal(status, code, words)
            return Refusal(status, code, f"{name}: the header holds a NUL character", name)
    return None


class TextOnly:
    """Refuse a path, query string or read header that is not text a store keeps."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = refusal(scope) if scope["type"] == "http" else None
        if found is None:
            await self.app(scope, receive, send)
            return
        headers = {"WWW-Authenticate": "Bearer"} if found.status == 401 else None
        response = error_response(found.status, found.code, found.message, found.field, headers)
        await response(scope, receive, send)
