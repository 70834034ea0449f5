"""``GET /metrics``: the Prometheus exposition (:mod:`lakeshore.services.metrics`)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from lakeshore.api.deps import Credentials, State, principal
from lakeshore.services.metrics import CONTENT_TYPE

router = APIRouter(tags=["health"])


@router.get(
    "/metrics",
    summary="Prometheus metrics (the admin token, or none with LAKESHORE_METRICS_PUBLIC)",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE: {}}, "description": "The text format"}},
    description=(
        "This replica's HTTP requests, ticks and decisions, and — on the replica that "
        "leads the elasticity controller (any server on SQLite) — the store's gauges per "
        "queue. The metric list and a scrape configuration are in docs/observability.md."
    ),
)
async def metrics(request: Request, state: State, credentials: Credentials) -> Response:
    if not state.settings.metrics_public:
        caller = await principal(request, credentials)
        caller.require_admin("read the metrics (or set LAKESHORE_METRICS_PUBLIC=true)")
    export = not state.settings.elasticity_enabled or state.leadership.leads_cluster
    body = await state.metrics.render(state.store, state.clock(), export_store=export)
    return Response(body, media_type=CONTENT_TYPE)
