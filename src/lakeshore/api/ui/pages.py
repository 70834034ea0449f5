"""The dashboard's pages: sign-in, queues, a queue, an invocation, the fleet.

Server-side templates (Jinja2) with htmx for the live parts: a page's live fragments are
the same routes with ``HX-Request`` set, polled every few seconds while the tab is visible.
Everything a page shows comes from the services the JSON API uses; counts for the queues
page come from the shared :class:`~lakeshore.services.overview.Overview` read.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Form, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse
from fastapi.routing import APIRoute
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, PackageLoader, select_autoescape

from lakeshore import __version__
from lakeshore.api.deps import AppState, app_state
from lakeshore.api.ui import session
from lakeshore.api.ui.session import CSRF_FIELD, CSRF_HEADER, LOGIN_COOKIE, SESSION_COOKIE
from lakeshore.errors import InvalidInput, LakeshoreError, NotFound, TooManyRequests, Unauthorized
from lakeshore.services import namespaces as ns_service
from lakeshore.services import queues as queue_service
from lakeshore.services.auth import Principal
from lakeshore.services.fleet import daemons as daemon_service
from lakeshore.services.fleet import feed as feed_service
from lakeshore.services.fleet import providers as provider_service
from lakeshore.services.namespaces import Namespace
from lakeshore.services.taskqueue import invocations as inv_service
from lakeshore.services.taskqueue import schedules as schedule_service
from lakeshore.store import invocations as inv_store
from lakeshore.store import launches as launch_store

STATES = ("pending", "running", "succeeded", "failed", "cancelled", "expired")
RETRYABLE = inv_store.RETRYABLE
BULK = {  # the queue page's buttons: (action, state, past tense)
    "retry_failed": ("retry", "failed", "retried"),
    "cancel_pending": ("cancel", "pending", "cancelled"),
}
PAGE = 50  # invocations, decisions
QUEUES_PAGE = 100
LIVE_S = 3  # how often a visible page refreshes its live parts
SECURITY_HEADERS = {
    # everything the pages load is the server's own: no inline script, no other origin
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


class SignIn(Exception):
    """No valid session: to the sign-in page."""


def _ago(value: datetime | str | None, now: datetime) -> str:
    if value is None:
        return "—"
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    seconds = max(0.0, (now - value).total_seconds())
    if seconds < 60:
        return f"{seconds:.0f}s ago"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m ago"
    if seconds < 86400:
        return f"{seconds / 3600:.1f}h ago"
    return f"{seconds / 86400:.1f}d ago"


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


_env = Environment(
    loader=PackageLoader("lakeshore.api.ui", "templates"),
    autoescape=select_autoescape(default=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
_env.filters["age"] = _age
_env.filters["pretty"] = lambda value: json.dumps(value, indent=2, ensure_ascii=False)
templates = Jinja2Templates(env=_env)


class HtmlErrors(APIRoute):
    """Refusals as pages (or, for htmx, as a short fragment), never the API's JSON; no
    session sends the browser to sign in."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            response = await _answer(request)
            response.headers.update(SECURITY_HEADERS)
            return response

        async def _answer(request: Request) -> Response:
            try:
                return await handler(request)
            except (SignIn, Unauthorized):
                target = "/ui/login"
                if request.headers.get("hx-request"):
                    return Response(status_code=401, headers={"HX-Redirect": target})
                return RedirectResponse(target, status_code=303)
            except LakeshoreError as exc:
                return _error_page(request, exc.status, exc.message)
            except RequestValidationError as exc:
                first = exc.errors()[0] if exc.errors() else {}
                where = ".".join(str(p) for p in first.get("loc", ())[1:])
                return _error_page(request, 422, f"{where}: {first.get('msg', 'invalid')}")

        return handle


def _error_page(request: Request, status: int, message: str) -> Response:
    if request.headers.get("hx-request"):
        return HTMLResponse(
            templates.get_template("_error.html").render(message=message), status_code=status
        )
    return templates.TemplateResponse(
        request,
        "error.html",
        {"status": status, "message": message, "version": __version__},
        status_code=status,
    )


router = APIRouter(prefix="/ui", include_in_schema=False, route_class=HtmlErrors)


@dataclass(frozen=True)
class Viewer:
    """Who looks, in which namespace, and what the page's forms carry."""

    principal: Principal
    ns: Namespace
    namespaces: list[str]  # the ones the viewer may switch to
    csrf: str
    state: AppState

    @property
    def now(self) -> datetime:
        return self.state.clock()

    def page(self, request: Request, name: str, **context: Any) -> Response:
        context.update(
            viewer=self,
            ns=self.ns.name,
            csrf=self.csrf,
            live_s=LIVE_S,
            version=__version__,
            now=self.now,
            ago=lambda value: _ago(value, self.now),
        )
        return templates.TemplateResponse(request, name, context)


async def _principal(request: Request, state: AppState) -> Principal:
    principal = await state.sessions.principal(request, state.store, state.clock())
    if principal is None:
        raise SignIn
    return principal


async def viewer(ns: str, request: Request) -> Viewer:
    state = app_state(request)
    principal = await _principal(request, state)
    namespace = await ns_service.resolve(state.store, principal, ns, state.namespaces)
    names = (
        [n.name for n in await ns_service.list_visible(state.store, principal)]
        if principal.is_admin
        else [namespace.name]
    )
    return Viewer(principal, namespace, names, state.sessions.csrf(request), state)


async def changing(request: Request, who: Annotated[Viewer, Depends(viewer)]) -> Viewer:
    """A viewer whose request changes something: the CSRF token is checked first."""
    presented = request.headers.get(CSRF_HEADER)
    if presented is None:
        form = await request.form()
        value = form.get(CSRF_FIELD)
        presented = value if isinstance(value, str) else None
    who.state.sessions.check(request, presented, cookie=SESSION_COOKIE)
    return who


Looker = Annotated[Viewer, Depends(viewer)]
Changer = Annotated[Viewer, Depends(changing)]


def _live(request: Request) -> bool:
    return bool(request.headers.get("hx-request"))


# --- sign in and out ------------------------------------------------------------------


@router.get("")
async def home(request: Request) -> Response:
    state = app_state(request)
    try:
        principal = await _principal(request, state)
    except (SignIn, LakeshoreError):
        return RedirectResponse("/ui/login", status_code=303)
    ns = principal.namespace or ns_service.DEFAULT_NAMESPACE
    return RedirectResponse(f"/ui/ns/{ns}/queues", status_code=303)


def _login_page(request: Request, error: str | None = None, status: int = 200) -> Response:
    state = app_state(request)
    value = session.new_login_value()
    response = templates.TemplateResponse(
        request,
        "login.html",
        {"csrf": state.sessions.csrf_for(value), "error": error, "version": __version__},
        status_code=status,
    )
    session.set_cookie(response, request, LOGIN_COOKIE, value, max_age=3600)
    return response


@router.get("/login")
async def login_form(request: Request) -> Response:
    return _login_page(request)


@router.post("/login")
async def login(
    request: Request,
    token: Annotated[str, Form(max_length=512)] = "",
    csrf: Annotated[str, Form(max_length=128)] = "",
) -> Response:
    state = app_state(request)
    state.sessions.check(request, csrf, cookie=LOGIN_COOKIE)
    token = token.strip()
    try:
        # wrong tokens are counted against the address, as the API's are
        principal = await state.callers.authenticate(token, request.scope.get("client"))
        principal.require_scope("/ui")
    except LakeshoreError as exc:
        refused = _login_page(request, exc.message, status=exc.status)
        if isinstance(exc, TooManyRequests):
            refused.headers.update(exc.headers)
        return refused
    ns = principal.namespace or ns_service.DEFAULT_NAMESPACE
    session_id = await state.sessions.begin(request, state.store, principal, state.clock())
    response = RedirectResponse(f"/ui/ns/{ns}/queues", status_code=303)
    session.set_cookie(response, request, SESSION_COOKIE, session_id, session.MAX_AGE_S)
    session.clear_cookie(response, LOGIN_COOKIE)
    return response


@router.post("/logout")
async def logout(request: Request, csrf: Annotated[str, Form(max_length=128)] = "") -> Response:
    state = app_state(request)
    state.sessions.check(request, csrf, cookie=SESSION_COOKIE)
    await state.sessions.end(request, state.store)  # on every replica, not just this browser
    response = RedirectResponse("/ui/login", status_code=303)
    session.clear_cookie(response, SESSION_COOKIE)
    return response


# --- queues ---------------------------------------------------------------------------


@router.get("/ns/{ns}/queues")
async def queues_page(
    request: Request,
    who: Looker,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> Response:
    state = who.state
    page = await queue_service.list_page(state.store, who.ns, limit=QUEUES_PAGE, cursor=cursor)
    snapshot = await state.overview.current()
    rows = []
    for queue in page.queues:
        g = snapshot.of(who.ns.id, queue.name)
        latest = snapshot.decision(who.ns.id, queue.name)
        elasticity = queue.spec.elasticity
        rows.append(
            {
                "name": queue.name,
                "state": queue.state,
                "policy": _policy_words(elasticity),
                "provider": queue.spec.provider_ref or "—",
                "pending": g.pending if g else 0,
                "scheduled": g.scheduled if g else 0,  # delayed, not due yet
                "running": g.running if g else 0,
                "oldest": (snapshot.taken_at - g.oldest_pending_at).total_seconds()
                if g and g.oldest_pending_at
                else None,
                "daemons": g.daemons if g else 0,
                "booting": g.launches_in_flight if g else 0,
                "decision": feed_service.event_json(latest) if latest else None,
            }
        )
    name = "_queues_rows.html" if _live(request) else "queues.html"
    return who.page(
        request, name, rows=rows, next_cursor=page.next_cursor, taken_at=snapshot.taken_at
    )


def _policy_words(elasticity: Any) -> str:
    if elasticity is None:
        return "none"
    kind = str(elasticity.kind)
    bounds = f"{elasticity.min}-{elasticity.max}" if elasticity.max is not None else ""
    pool = f", pool {elasticity.pool}" if elasticity.pool else ""
    return f"{kind} {bounds}{pool}".strip()


# --- a queue --------------------------------------------------------------------------


@router.get("/ns/{ns}/queues/{name}")
async def queue_page(
    request: Request,
    name: str,
    who: Looker,
    state_filter: Annotated[Literal[STATES] | None, Query(alias="state")] = None,  # type: ignore[valid-type]
    cursor: Annotated[str | None, Query(max_length=200)] = None,
    verbose: bool = False,
) -> Response:
    state = who.state
    queue = await queue_service.get(state.store, who.ns, name)
    explained = await feed_service.explain(state.store, who.ns, name, who.now, by_state=False)
    explained["now"]["schedules"] = await schedule_service.next_slots(
        state.store, who.ns, name, who.now
    )
    if _live(request):
        return who.page(request, "_queue_summary.html", queue=queue, explain=explained)
    events = await feed_service.queue_events(state.store, who.ns, name, verbose=verbose, limit=PAGE)
    listed = await inv_service.list_for_queue(
        state.store,
        who.ns,
        name,
        states=[state_filter] if state_filter else [],
        limit=PAGE,
        cursor=cursor,
        caller=who.principal,
    )
    return who.page(
        request,
        "queue.html",
        queue=queue,
        explain=explained,
        events=events["events"],
        verbose=verbose,
        invocations=listed["invocations"],
        next_cursor=listed["next_cursor"],
        state_filter=state_filter,
        states=STATES,
    )


@router.get("/ns/{ns}/queues/{name}/series")
async def queue_series(name: str, who: Looker) -> JSONResponse:
    """The queue's pending, running and daemons as this server sampled them (JSON for
    the page's chart)."""
    state = who.state
    await queue_service.get(state.store, who.ns, name)
    await state.overview.current()
    return JSONResponse({"points": state.overview.points(who.ns.id, name)})


@router.get("/ns/{ns}/queues/{name}/timeline")
async def queue_timeline(
    request: Request,
    name: str,
    who: Looker,
    verbose: bool = False,
    cursor: Annotated[str | None, Query(max_length=40)] = None,
) -> Response:
    events = await feed_service.queue_events(
        who.state.store, who.ns, name, verbose=verbose, limit=PAGE, cursor=cursor
    )
    return who.page(
        request,
        "_timeline.html",
        queue_name=name,
        events=events["events"],
        next_cursor=events["next_cursor"],
        verbose=verbose,
    )


# --- invocations ----------------------------------------------------------------------


@router.get("/ns/{ns}/invocations/{invocation_id}")
async def invocation_page(request: Request, invocation_id: str, who: Looker) -> Response:
    if len(invocation_id) > 64:
        raise NotFound(f'invocation "{invocation_id[:64]}…" not found', field="id")
    found = await inv_service.get(who.state.store, who.ns, invocation_id, who.principal)
    return who.page(request, "invocation.html", inv=found, retryable=RETRYABLE)


@router.post("/ns/{ns}/invocations/{invocation_id}/cancel")
async def cancel_invocation(invocation_id: str, who: Changer) -> Response:
    state = who.state
    await inv_service.cancel(
        state.store, state.notifier, who.ns, invocation_id, who.now, who.principal, state.metrics
    )
    return RedirectResponse(f"/ui/ns/{who.ns.name}/invocations/{invocation_id}", status_code=303)


@router.post("/ns/{ns}/invocations/{invocation_id}/retry")
async def retry_invocation(invocation_id: str, who: Changer) -> Response:
    state = who.state
    await inv_service.retry(
        state.store, state.notifier, who.ns, invocation_id, who.now, who.principal
    )
    return RedirectResponse(f"/ui/ns/{who.ns.name}/invocations/{invocation_id}", status_code=303)


@router.post("/ns/{ns}/queues/{name}/bulk")
async def bulk_action(
    name: str, who: Changer, action: Annotated[str, Form(max_length=40)] = ""
) -> Response:
    if action not in BULK:
        raise InvalidInput(f"action is one of {', '.join(BULK)}", field="action")
    verb, state_name, done = BULK[action]
    state = who.state
    touched = await inv_service.bulk(
        state.store,
        state.notifier,
        who.ns,
        name,
        verb,
        state_name,
        who.now,
        who.principal,
        state.metrics,
    )
    return RedirectResponse(
        f"/ui/ns/{who.ns.name}/queues/{name}?touched={touched}&did={done}", status_code=303
    )


# --- fleet ----------------------------------------------------------------------------


@router.get("/ns/{ns}/fleet")
async def fleet_page(request: Request, who: Looker) -> Response:
    state = who.state
    daemons = (await daemon_service.list_(state.store, who.ns))["daemons"]
    providers = await provider_service.list_(state.store, who.ns)
    async with state.store.read() as conn:
        flying = await launch_store.in_flight_for_namespace(conn, who.ns.id, who.now)
    launches = [provider_service.launch_json(row) for row in flying]
    name = "_fleet.html" if _live(request) else "fleet.html"
    return who.page(request, name, daemons=daemons, providers=providers, launches=launches)
