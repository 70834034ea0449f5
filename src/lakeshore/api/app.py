"""The HTTP application: lifespan (migrate, connect, bootstrap), middleware, routes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import anyio
from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from sqlalchemy.engine import URL

from lakeshore import __version__, files
from lakeshore.api import errors, openapi
from lakeshore.api.deps import AppState, Clock
from lakeshore.api.head import HeadAsGet
from lakeshore.api.inputs import TextOnly
from lakeshore.api.limits import BodySizeLimit
from lakeshore.api.measured import Measured
from lakeshore.api.routes import (
    admin,
    daemons,
    dist,
    feed,
    health,
    invocations,
    namespaces,
    providers,
    queues,
)
from lakeshore.api.routes import (
    metrics as metrics_routes,
)
from lakeshore.api.routes import schedules as schedule_routes
from lakeshore.api.routes import workers as worker_routes
from lakeshore.api.single_headers import SingleHeaders
from lakeshore.api.ui import pages as ui_pages
from lakeshore.api.ui.session import Sessions
from lakeshore.config import DEFAULT_URL, Settings
from lakeshore.errors import Conflict
from lakeshore.services import auth, leading
from lakeshore.services import namespaces as ns_service
from lakeshore.services import queues as queue_service
from lakeshore.services.fleet import elasticity_loop
from lakeshore.services.fleet import local_fleet as local_fleet_service
from lakeshore.services.fleet.controller import Controller
from lakeshore.services.metrics import Metrics
from lakeshore.services.overview import Overview
from lakeshore.services.taskqueue import reaper, retention
from lakeshore.services.taskqueue import schedules as schedule_service
from lakeshore.services.taskqueue.notify import Notifier
from lakeshore.store import dbclock, wakeups
from lakeshore.store.dbclock import ServerClock
from lakeshore.store.engine import Store, create_engine_for, parse_url, prepare
from lakeshore.store.leadership import Duty, Leadership, Replicas, Solo, housekeeping

log = logging.getLogger("lakeshore.server")
LISTENER_START_S = 5.0


DEMO_QUEUE = {
    "name": "demo",
    "description": "A first queue to look at: fully elastic, 0 to 4 daemons.",
    "elasticity": {"kind": "fully_elastic", "min": 0, "max": 4},
}


async def _create_demo_queue(store: Store, now: datetime) -> None:
    ns = await ns_service.resolve(store, auth.ADMIN, ns_service.DEFAULT_NAMESPACE)
    with contextlib.suppress(Conflict):  # kept from an earlier start
        await queue_service.create(store, ns, DEMO_QUEUE, now)


async def _reap_forever(
    store: Store,
    clock: ServerClock,
    interval_s: float,
    metrics: Metrics | None = None,
    *,
    notifier: Notifier | None = None,
    working: asyncio.Lock | None = None,
) -> None:
    """Return expired leases and drop silent workers, every ``interval_s``; a failed sweep
    is logged and the next one runs on time. ``working`` is held through each sweep. A
    sweep whose clock cannot be checked against the store's is skipped (logged)."""
    working = working or asyncio.Lock()
    while True:
        await asyncio.sleep(interval_s)
        if not await clock.check():
            continue
        try:
            async with working:
                counts = await reaper.reap(store, clock(), metrics, notifier)
        except Exception:
            log.exception("reaper sweep failed")
            continue
        if any(counts.values()):
            log.info("reaper: %s", counts)


def _start_retention(
    settings: Settings, store: Store, duty: Duty, clock: Clock, metrics: Metrics
) -> list[tuple[asyncio.Task[None], asyncio.Lock | None]]:
    """The retention sweep's loop (it deletes only where this server does the cluster's
    housekeeping) with its lock, unless its interval is 0."""
    if settings.retention_interval_s <= 0:
        return []
    deleting = asyncio.Lock()
    windows = retention.Windows(
        retention_s=settings.retention_s,
        event_retention_s=settings.event_retention_s,
        noop_retention_s=settings.elasticity_noop_retention_s,
    )
    pruning = retention.run_forever(
        store,
        duty,
        clock,
        settings.retention_interval_s,
        windows,
        metrics,
        working=deleting,
    )
    return [(asyncio.create_task(pruning, name="lakeshore-retention"), deleting)]


STOP_WAIT_S = 10.0  # the longest shutdown waits for a loop's step to end


async def _stop_between_steps(task: asyncio.Task[None], working: asyncio.Lock | None) -> None:
    """Cancel a background loop between two of its steps (a tick, a sweep), waiting up to
    :data:`STOP_WAIT_S` for the one under way, so no transaction of the loop's is still
    open when the shutdown's own writes (the local daemons' launch records) begin. They
    once failed on SQLite with "database is locked" after the loops had been cancelled
    wherever they stood."""
    held = False
    if working is not None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STOP_WAIT_S):
                await working.acquire()
                held = True
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    if held and working is not None:
        working.release()


async def _stop_loops(tasks: list[tuple[asyncio.Task[None], asyncio.Lock | None]]) -> None:
    for task, working in tasks:
        await _stop_between_steps(task, working)


@dataclass
class _LocalFleet:
    """The daemons ``lakeshore up`` launched, stopped with the server."""

    store: Store
    clock: Clock
    loops: list[tuple[asyncio.Task[None], asyncio.Lock | None]]  # the server's loops

    async def stop(self) -> None:
        """The loops first (the controller would launch replacements), then the daemons:
        each finishes what it runs, reports it and says goodbye, while the server still
        answers (see begin_stopping)."""
        await _stop_loops(self.loops)
        await local_fleet_service.stop_all(self.store, self.clock())


async def _start_listener(
    url: URL, notifier: Notifier, connected: asyncio.Event
) -> asyncio.Task[None]:
    """LISTEN for other replicas' wake-ups; wait (briefly) until it is listening
    (``connected`` is set while it is)."""
    task = asyncio.create_task(
        wakeups.listen(url, notifier.notify, notifier.notify_all, connected=connected),
        name="lakeshore-wakeups",
    )
    try:
        async with asyncio.timeout(LISTENER_START_S):
            await connected.wait()
    except TimeoutError:
        log.warning("not yet listening for other replicas' wake-ups; retrying in the background")
    return task


async def begin_stopping(app: FastAPI) -> None:
    """The server is asked to stop, and still answers. First what must happen while it
    does: ``lakeshore up`` stops its controller (which would launch replacements) and
    the daemons it launched, which finish what they run, report it, and say goodbye.
    Then waiting claims answer now, with nothing, and invocation streams end, so that the
    requests still open (which a graceful stop waits for) end at once instead of after a
    claim's 20 s or a stream's whole life. A daemon claims again once the server is back;
    a follower resumes after the last item it got."""
    state = getattr(app.state, "lakeshore", None)
    if state is None:  # stopped before its lifespan began
        return
    if state.before_stop is not None:
        try:
            await state.before_stop()
        except Exception:  # the stop goes on: the lifespan's shutdown tries again
            log.exception("stopping the local daemons failed")
    state.stopping.set()
    for gone in list(state.hangups):
        gone.set()


def create_app(
    settings: Settings | None = None,
    *,
    clock: Clock | None = None,
    demo: bool = False,
    local_fleet: bool = False,
) -> FastAPI:
    """The API application; ``clock`` is the time it runs on (by default the wall clock,
    on PostgreSQL corrected by its offset from the database's: :mod:`.dbclock`);
    ``demo`` creates the demo queue at start if it is missing;
    ``local_fleet`` (``lakeshore up``) registers the ``local`` provider and stops the
    daemons it launched when the server stops."""
    settings = settings or Settings()
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        url = parse_url(settings.resolved_database_url)
        await anyio.to_thread.run_sync(prepare, url)
        store = Store(create_engine_for(url))
        server_clock = await dbclock.for_server(store, clock)
        token, token_path = auth.load_or_create_admin_token(
            settings.admin_token, settings.admin_token_path
        )
        await ns_service.ensure(store, ns_service.DEFAULT_NAMESPACE, server_clock())
        if local_fleet:
            files.private_dir(settings.data_dir)  # daemon logs go there: UDF output
            await local_fleet_service.ensure_provider(
                store, settings.data_dir / "daemons", server_clock(), code_dir=Path.cwd()
            )
        if demo:
            await _create_demo_queue(store, server_clock())
        notifier = Notifier()
        overview = Overview(store, server_clock)
        controller = Controller(
            store,
            clock=server_clock,
            server_url=settings.public_url or DEFAULT_URL,
            node_id=settings.node_id,
            call_timeout_s=settings.elasticity_call_timeout_s,
            allowed_scalers=settings.scaler_paths,
            notifier=notifier,
            metrics=metrics,
        )
        postgresql = url.get_backend_name() == "postgresql"
        leadership: Leadership = Replicas(url, settings.node_id) if postgresql else Solo()
        listening = asyncio.Event() if postgresql else None
        app.state.lakeshore = AppState(
            settings=settings,
            store=store,
            admin_token=token,
            admin_token_path=token_path,
            clock=server_clock,
            notifier=notifier,
            controller=controller,
            leadership=leadership,
            callers=auth.Callers(store, token, clock=server_clock),
            metrics=metrics,
            overview=overview,
            sessions=Sessions(token),
            wakeups_listening=listening,
        )
        # background loops, each with the lock it holds through a step (None: no store
        # transaction to finish, cancelled at once)
        tasks: list[tuple[asyncio.Task[None], asyncio.Lock | None]] = []
        if listening is not None:
            tasks.append((await _start_listener(url, notifier, listening), None))
        log.info(
            "lakeshore %s serving on %s", __version__, url.render_as_string(hide_password=True)
        )
        if settings.reaper_interval_s > 0:
            sweeping = asyncio.Lock()
            reaping = _reap_forever(
                store,
                server_clock,
                settings.reaper_interval_s,
                metrics,
                notifier=notifier,
                working=sweeping,
            )
            tasks.append((asyncio.create_task(reaping, name="lakeshore-reaper"), sweeping))
        duty = housekeeping(url)
        tasks.extend(_start_retention(settings, store, duty, server_clock, metrics))
        if settings.elasticity_enabled:
            ticking = asyncio.Lock()
            controlling = elasticity_loop.run_forever(
                controller, leadership, settings.elasticity_interval_s, working=ticking
            )
            tasks.append((asyncio.create_task(controlling, name="lakeshore-controller"), ticking))
        # the cluster's housekeeping (one server at a time, elasticity on or off): the
        # schedules' due slots, the retention sweep
        looking = leading.run_forever(duty, settings.elasticity_interval_s)
        tasks.append((asyncio.create_task(looking, name="lakeshore-housekeeping"), None))
        scheduling = asyncio.Lock()
        enqueuing = schedule_service.run_forever(
            store, notifier, duty, server_clock, working=scheduling
        )
        tasks.append((asyncio.create_task(enqueuing, name="lakeshore-schedules"), scheduling))
        fleet = _LocalFleet(store, server_clock, tasks) if local_fleet else None
        if fleet is not None:
            app.state.lakeshore.before_stop = fleet.stop
        try:
            yield
        finally:
            await _stop_loops(tasks)  # stopped already where a local fleet was
            await leadership.release()
            await duty.release()
            await controller.close()
            await overview.close()
            if fleet is not None:  # none left when it was stopped while the server answered
                await fleet.stop()
            await store.close()

    app = FastAPI(
        # Lakeshore's metrics are its own (GET /metrics); FastAPI's OpenTelemetry would
        # look for configured providers on every request, a few microseconds each
        telemetry={"tracing": False, "metrics": False, "logs": False},
        title="Lakeshore",
        version=__version__,
        description="Elastic queues: task queues whose worker fleets scale themselves.",
        lifespan=lifespan,
        # no redirect to the slash-less path: its Location would be built from the Host
        # header a client sent; a trailing slash is a 404 like any other unknown path
        redirect_slashes=False,
        swagger_ui_oauth2_redirect_url=None,  # bearer tokens only: no OAuth2 page
    )
    errors.install(app)
    app.add_middleware(TextOnly)  # ids and names reach the store as text
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(SingleHeaders)  # one Authorization, one Content-Type
    app.add_middleware(HeadAsGet)  # all the rest see the GET
    app.add_middleware(Measured, metrics=metrics)  # outermost: every answer counted
    routers = (
        health.router,
        metrics_routes.router,
        namespaces.router,
        queues.router,
        schedule_routes.router,
        providers.router,
        admin.router,
        feed.router,
        daemons.router,
        invocations.router,
        worker_routes.router,
        dist.router,
    )
    # matched in this order, one router after another: the hot paths (a daemon's claims
    # and reports, submits) first, so a request among them is not tried against every
    # other router's routes before its own. The documentation keeps ``routers``' order
    # (see :func:`openapi.install`).
    hot = (worker_routes.router, invocations.router)
    for router in (*hot, *(r for r in routers if r not in hot)):
        app.include_router(router)
    app.include_router(ui_pages.router)
    openapi.install(app, tags=[tag for r in routers for tag in r.tags])
    static = StaticFiles(packages=[("lakeshore.api.ui", "static")])
    app.mount("/ui/static", static, name="ui-static")
    return app
