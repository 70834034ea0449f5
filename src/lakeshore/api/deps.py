"""What every route needs: the app's state, the caller, and the time."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Annotated

from cachetools import TTLCache
from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from lakeshore.api.ui.session import Sessions
from lakeshore.config import Settings
from lakeshore.services import auth
from lakeshore.services import namespaces as ns_service
from lakeshore.services.auth import Principal
from lakeshore.services.fleet.controller import Controller
from lakeshore.services.metrics import Metrics
from lakeshore.services.namespaces import Namespace
from lakeshore.services.overview import Overview
from lakeshore.services.taskqueue.handoff import Waiting
from lakeshore.services.taskqueue.invocations import KnownQueues
from lakeshore.services.taskqueue.notify import Hangup, Notifier
from lakeshore.store.engine import Store
from lakeshore.store.leadership import Leadership

Clock = Callable[[], datetime]
KNOWN_QUEUES_MAX = 10_000


@dataclass
class AppState:
    settings: Settings
    store: Store
    admin_token: str
    admin_token_path: Path | None
    clock: Clock
    notifier: Notifier
    controller: Controller
    leadership: Leadership
    callers: auth.Callers  # who the presented tokens name (remembered for a second)
    metrics: Metrics
    overview: Overview  # the dashboard's shared read
    sessions: Sessions  # the dashboard's sign-ins
    # set while this replica LISTENs for the others' wake-ups (PostgreSQL); None on SQLite
    wakeups_listening: asyncio.Event | None = None
    namespaces: MutableMapping[str, Namespace] = field(  # found by name, remembered
        default_factory=lambda: TTLCache(auth.CALLERS_MAX, auth.CALLERS_TTL_S)
    )
    # queues as submits last read them (checked against the row's revision before use)
    queues: KnownQueues = field(default_factory=lambda: TTLCache(KNOWN_QUEUES_MAX, 600.0))
    # the claims waiting here, which a submit may hand its invocation to
    waiting: Waiting = field(default_factory=Waiting)
    # set as the server begins to stop: waiting claims answer and streams end at once,
    # rather than holding the shutdown (see api.app.begin_stopping)
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    # the claims waiting here, each set (answered empty) as the server begins to stop
    hangups: set[Hangup] = field(default_factory=set)
    # what must happen while the server still answers, once it is asked to stop (the
    # local fleet's daemons, which report and say goodbye to it); None: nothing
    before_stop: Callable[[], Awaitable[None]] | None = None


def app_state(request: Request) -> AppState:
    state: AppState = request.app.state.lakeshore
    return state


_bearer = HTTPBearer(auto_error=False, description="A namespace token, or the admin token.")


def bearer_token(request: Request) -> str | None:
    """The token of the request's ``Authorization: Bearer …``, read as :data:`_bearer`
    reads it (the first such header; a request with two is refused before routing)."""
    scheme, _, token = (request.headers.get("authorization") or "").partition(" ")
    token = token.strip()
    return token if token and scheme.lower() == "bearer" else None


async def _caller(state: AppState, request: Request, presented: str | None) -> Principal:
    # the address as the server sees it (uvicorn rewrites it from X-Forwarded-For for
    # the hops LAKESHORE_FORWARDED_ALLOW_IPS trusts): its wrong tokens are throttled
    caller = await state.callers.authenticate(presented, request.scope.get("client"))
    route = request.scope.get("route")
    caller.require_scope(getattr(route, "path", None) or request.scope["path"])
    return caller


async def principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """The caller, checked against the route it asked for: every route that takes a token
    comes through here, so a worker token is refused everywhere but the worker routes."""
    presented = credentials.credentials if credentials else None
    return await _caller(app_state(request), request, presented)


async def namespace(
    ns: str,
    request: Request,
    caller: Annotated[Principal, Depends(principal)],
) -> Namespace:
    state = app_state(request)
    return await ns_service.resolve(state.store, caller, ns, state.namespaces)


@dataclass(frozen=True)
class Submitting:
    """What a submit needs of its request: the app's state, the caller and its
    namespace, in one dependency (FastAPI resolves each dependency of a route on every
    request: the chain of four :data:`InNamespace`, :data:`State` and :data:`Caller`
    make was a tenth of a single submit's time on the server)."""

    state: AppState
    caller: Principal
    ns: Namespace


async def submitting(
    ns: str,
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Submitting:
    return await submitting_as(ns, request, credentials.credentials if credentials else None)


async def submitting_as(ns: str, request: Request, presented: str | None) -> Submitting:
    """:func:`submitting`, given the token the request presents (:func:`bearer_token`):
    what a route that reads its own request (:mod:`lakeshore.api.lean`) calls."""
    state = app_state(request)
    caller = await _caller(state, request, presented)
    return Submitting(
        state, caller, await ns_service.resolve(state.store, caller, ns, state.namespaces)
    )


async def _state(request: Request) -> AppState:
    """:func:`app_state` as a dependency: a coroutine, since FastAPI runs a plain
    function dependency on a worker thread, a thread hand-off on every request."""
    return app_state(request)


State = Annotated[AppState, Depends(_state)]
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
Caller = Annotated[Principal, Depends(principal)]
InNamespace = Annotated[Namespace, Depends(namespace)]
Submit = Annotated[Submitting, Depends(submitting)]
