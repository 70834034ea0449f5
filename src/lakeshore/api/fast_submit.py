"""A single submit answered under the framework, when nothing but a success can follow.

``POST /v1/namespaces/{ns}/queues/{name}/invocations`` is the one request a user's code
makes per call; FastAPI's request handling (routing, the body's parsing, dependency
solving, the answer) was most of its time on the server. This layer sits inside the
middleware that counts, caps and checks every request (``Measured``, ``BodySizeLimit``,
``TextOnly``), reads the body, and answers the submit itself when its caller, namespace
and queue are already known to this server and the one-statement submit takes it
(:func:`lakeshore.services.invocations.submit_one_known`). Everything else (a query
string, another content type, an unknown token, a queue not seen yet, any refusal)
goes on to the routes with the body it read, untouched, and is answered there (so does
a body of undeclared length, before it is read): nothing
is written before the hand-over, so no request is made twice, and every refusal keeps
the words the route gives it.
"""

from __future__ import annotations

import orjson
from sqlalchemy.exc import InterfaceError, OperationalError
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from lakeshore.api.answers import json_answer
from lakeshore.api.errors import error_response, store_down
from lakeshore.errors import LakeshoreError, StoreUnavailable
from lakeshore.services import invocations as inv_service
from lakeshore.services import namespaces as ns_service

PATH = "/v1/namespaces/{ns}/queues/{name}/invocations"
_JSON = b"application/json"


def _headers(scope: Scope) -> tuple[str | None, bytes | None, bool]:
    """The bearer token and the content type, as the route would read them, and whether
    the body's length was declared."""
    token: str | None = None
    kind: bytes | None = None
    sized = False
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, credentials = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and credentials:
                token = credentials
        elif name == b"content-type":
            kind = value
        elif name == b"content-length":
            sized = True
    return token, kind, sized


class FastSubmit:
    """``route``: the submit's own route, named in the request's scope as the router
    would name it (what ``Measured`` counts the answer under)."""

    def __init__(self, app: ASGIApp, route: BaseRoute) -> None:
        if getattr(route, "path", None) != PATH:
            raise ValueError(f"FastSubmit answers {PATH}, not {getattr(route, 'path', route)}")
        self.app = app
        self.route = route

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["query_string"]:
            await self.app(scope, receive, send)
            return
        parts = scope["path"].split("/")
        # "", "v1", "namespaces", ns, "queues", name, "invocations"
        if (
            len(parts) != 7
            or parts[6] != "invocations"
            or parts[4] != "queues"
            or parts[2] != "namespaces"
            or parts[1] != "v1"
        ):
            await self.app(scope, receive, send)
            return
        token, kind, sized = _headers(scope)
        # a chunked body is left to the route: only there is a body over the cap, seen
        # as it streams, answered 413 (a declared length over it never gets this far)
        if token is None or kind != _JSON or not sized:
            await self.app(scope, receive, send)
            return
        read: list[Message] = []
        body = b""
        while True:
            message = await receive()
            read.append(message)
            if message["type"] != "http.request":
                break
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        if read[-1]["type"] == "http.request" and await self._answered(
            scope, receive, send, parts[3], parts[5], token, body
        ):
            return

        async def replayed() -> Message:
            return read.pop(0) if read else await receive()

        await self.app(scope, replayed, send)

    async def _answered(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        ns_name: str,
        queue_name: str,
        token: str,
        body: bytes,
    ) -> bool:
        route = self.route
        state = scope["app"].state.lakeshore
        try:
            content = orjson.loads(body)
            caller = await state.callers.authenticate(token)
            caller.require_scope(PATH)
            ns = await ns_service.resolve(state.store, caller, ns_name, state.namespaces)
        except (orjson.JSONDecodeError, LakeshoreError, OperationalError, InterfaceError):
            return False  # nothing written: the route answers, with its words
        if type(content) is not dict:
            return False
        try:
            invocation = await inv_service.submit_one_known(
                state.store,
                state.notifier,
                state.queues,
                ns,
                queue_name,
                content,
                state.clock(),
                max_payload_bytes=state.settings.max_payload_bytes,
                caller=caller,
                waiting=state.waiting,
            )
        except (OperationalError, InterfaceError) as exc:
            scope["route"] = route
            await store_down(exc)(scope, receive, send)
            return True
        except StoreUnavailable as exc:  # SQLite: this process's writers queued too long
            scope["route"] = route
            await error_response(exc.status, exc.code, exc.message)(scope, receive, send)
            return True
        if invocation is None:
            return False
        scope["route"] = route  # counted under the route's template
        state.metrics.submitted.labels(ns.name, queue_name).inc()
        await json_answer(invocation, 201)(scope, receive, send)
        return True
