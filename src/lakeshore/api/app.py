"""The HTTP application: lifespan (migrate, connect, bootstrap), middleware, routes."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path

import anyio
from fastapi import FastAPI

from lakeshore import __version__
from lakeshore.api import errors, openapi
from lakeshore.api.deps import AppState, Clock
from lakeshore.api.limits import BodySizeLimit
from lakeshore.api.routes import health, namespaces, queues
from lakeshore.config import Settings
from lakeshore.services import auth
from lakeshore.services import namespaces as ns_service
from lakeshore.store.engine import Store, create_engine_for, migrate, parse_url

log = logging.getLogger("lakeshore.server")


def utc_now() -> datetime:
    return datetime.now(UTC)


def create_app(settings: Settings | None = None, *, clock: Clock = utc_now) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        url = parse_url(settings.resolved_database_url)
        if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
            Path(url.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        await anyio.to_thread.run_sync(migrate, url)
        store = Store(create_engine_for(url))
        token, token_path = auth.load_or_create_admin_token(
            settings.admin_token, settings.admin_token_path
        )
        await ns_service.ensure(store, ns_service.DEFAULT_NAMESPACE, clock())
        app.state.lakeshore = AppState(
            settings=settings,
            store=store,
            admin_token=token,
            admin_token_path=token_path,
            clock=clock,
        )
        log.info("lakeshore %s serving on %s", __version__, url.render_as_string(hide_password=True))
        try:
            yield
        finally:
            await store.close()

    app = FastAPI(
        title="Lakeshore",
        version=__version__,
        description="Elastic queues: task queues whose worker fleets scale themselves.",
        lifespan=lifespan,
    )
    errors.install(app)
    openapi.install(app)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    for router in (health.router, namespaces.router, queues.router):
        app.include_router(router)
    return app
