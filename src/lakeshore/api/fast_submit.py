"""A single submit answered ahead of the framework, when nothing but a success can follow.

``POST /v1/namespaces/{ns}/queues/{name}/invocations`` is the one request a user's code
makes per call; FastAPI's request handling (its middleware, routing, the body's parsing,
dependency solving, the answer) was most of its time on the server. The application
(:class:`lakeshore.api.app.LakeshoreApp`) hands every request to this layer first. It
makes the checks of the middleware the request would cross (a path, query and read
headers that are text, as ``TextOnly``; a declared length within the body cap, as
``BodySizeLimit``; one ``Authorization`` and one ``Content-Type``, as ``SingleHeaders``),
reads the body, and answers the submit itself when its caller, namespace and queue are
already known to this server and the one-statement submit takes it
(:func:`lakeshore.services.invocations.submit_one_known`), counting and timing the
answer as ``Measured`` would. Everything else (a query string, another content type, an
unknown token, a queue not seen yet, any refusal) goes on to the framework with the body
it read, untouched, and is answered there (so does a body of undeclared length, before
it is read): nothing is written before the hand-over, so no request is made twice, and
every refusal keeps the words the route gives it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from sqlalchemy.exc import InterfaceError, OperationalError
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from lakeshore import jsontext
from lakeshore.api.answers import json_body
from lakeshore.api.errors import error_response, store_down
from lakeshore.api.inputs import refusal
from lakeshore.api.measured import record
from lakeshore.api.single_headers import duplicated
from lakeshore.errors import LakeshoreError, StoreUnavailable
from lakeshore.services import invocations as inv_service
from lakeshore.services import namespaces as ns_service

PATH = "/v1/namespaces/{ns}/queues/{name}/invocations"
_JSON = b"application/json"
log = logging.getLogger("lakeshore.api")  # as the framework's handler of the unexpected


def _headers(scope: Scope) -> tuple[str | None, bytes | None, int | None]:
    """The bearer token and the content type, as the route would read them, and the
    body's declared length (``None``: not declared, or not a length)."""
    token: str | None = None
    kind: bytes | None = None
    length: int | None = None
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, credentials = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and credentials:
                token = credentials
        elif name == b"content-type":
            kind = value
        elif name == b"content-length":
            length = int(value) if value.isdigit() else None
    return token, kind, length


class FastSubmit:
    """``app``: the framework's stack, which answers every request this layer does not;
    ``owner``: the application, whose ``state.lakeshore`` is read once it has started;
    ``route``: the submit's own route, whose template the answers are counted under."""

    def __init__(self, app: ASGIApp, owner: Any, route: BaseRoute, *, max_body_bytes: int) -> None:
        if getattr(route, "path", None) != PATH:
            raise ValueError(f"FastSubmit answers {PATH}, not {getattr(route, 'path', route)}")
        self.app = app
        self.owner = owner
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        began = time.perf_counter()
        if scope["type"] != "http" or scope["method"] != "POST" or scope["query_string"]:
            await self.app(scope, receive, send)
            return
        state = getattr(self.owner.state, "lakeshore", None)
        if state is None:  # not started: the framework answers as it would
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
        token, kind, length = _headers(scope)
        # a chunked body is left to the framework: only there is a body over the cap,
        # seen as it streams, answered 413, as is a declared length over it; a path or
        # header that is not text is refused there too, as is a repeated Authorization
        # or Content-Type (this door would read the last, the route the first)
        if (
            token is None
            or kind != _JSON
            or length is None
            or length > self.max_body_bytes
            or refusal(scope) is not None
            or duplicated(scope) is not None
        ):
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
            if not message.get("more_body", False) or len(body) > self.max_body_bytes:
                break  # the whole body, or more than the cap: the framework refuses that
        if (
            read[-1]["type"] == "http.request"
            and not read[-1].get("more_body", False)
            and len(body) <= self.max_body_bytes
            and await self._answering(
                scope, receive, send, state, parts[3], parts[5], token, body, began
            )
        ):
            return

        async def replayed() -> Message:
            return read.pop(0) if read else await receive()

        await self.app(scope, replayed, send)

    async def _answering(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        state: Any,
        ns_name: str,
        queue_name: str,
        token: str,
        body: bytes,
        began: float,
    ) -> bool:
        """:meth:`_answered`, counted and timed since ``began``; an error it did not
        expect is logged and, before an answer has begun, answered 500, as the
        framework's handler would."""
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            status = await self._answered(
                scope, receive, sending, state, ns_name, queue_name, token, body
            )
        except Exception:
            log.exception("unhandled error on POST %s", scope["path"])
            if started:
                raise
            status = 500
            answer = error_response(
                500, "internal_error", "internal error; the server log has details"
            )
            await answer(scope, receive, send)
        if status is None:
            return False
        record(state.metrics, "POST", PATH, status, began)
        return True

    async def _answered(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        state: Any,
        ns_name: str,
        queue_name: str,
        token: str,
        body: bytes,
    ) -> int | None:
        """The status answered, or ``None``: nothing written or sent, the framework
        answers."""
        if state.callers.throttled(scope.get("client")):
            return None  # an address sending wrong tokens: the route counts and refuses
        try:
            # read as the route reads it (an integer past 64 bits stays one); what it
            # cannot read (not JSON, too many digits, too deep) the route refuses
            content = jsontext.parsed(body)
            caller = await state.callers.authenticate(token)
            caller.require_scope(PATH)
            ns = await ns_service.resolve(state.store, caller, ns_name, state.namespaces)
        except (ValueError, RecursionError, LakeshoreError, OperationalError, InterfaceError):
            return None  # nothing written: the route answers, with its words
        if type(content) is not dict:
            return None
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
            await store_down(exc)(scope, receive, send)
            return 503
        except StoreUnavailable as exc:  # SQLite: this process's writers queued too long
            await error_response(exc.status, exc.code, exc.message)(scope, receive, send)
            return exc.status
        if invocation is None:
            return None
        state.metrics.submitted.labels(ns.name, queue_name).inc()
        answer = json_body(invocation)
        await send(
            {
                "type": "http.response.start",
                "status": 201,
                "headers": [
                    (b"content-length", str(len(answer)).encode()),
                    (b"content-type", _JSON),
                ],
            }
        )
        await send({"type": "http.response.body", "body": answer})
        return 201
