"""Liveness and readiness.

``/healthz`` answers while the process serves and its store answers a query (503 when it
does not). ``/readyz`` says whether this replica should be sent traffic: its store
answers, its schema is at the migration this version ships (a replica of a newer version
migrates at start; an older one must wait), and on PostgreSQL its listener for the other
replicas' wake-ups is connected (without it, waiting claims hear of new work only on
their fallback re-check).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy.exc import InterfaceError, OperationalError

from lakeshore import __version__
from lakeshore.api.deps import AppState, State
from lakeshore.errors import StoreUnavailable
from lakeshore.store.engine import head_revision

router = APIRouter(tags=["health"])
OK = "ok"


@router.get("/healthz", summary="Health check (no token needed)")
async def healthz(state: State) -> dict[str, Any]:
    await state.store.ping()
    return {"status": "ok", "version": __version__, "database": state.store.dialect}


@router.get(
    "/readyz",
    summary="Readiness: store reachable, schema current, wake-ups heard (no token needed)",
    responses={503: {"description": "not ready: `checks` says what is not"}},
)
async def readyz(state: State) -> JSONResponse:
    checks = await _checks(state)
    ready = all(value == OK for value in checks.values())
    body = {
        "status": "ready" if ready else "not_ready",
        "version": __version__,
        "database": state.store.dialect,
        "checks": checks,
    }
    return JSONResponse(body, status_code=200 if ready else 503)


async def _checks(state: AppState) -> dict[str, str]:
    checks: dict[str, str] = {}
    try:
        revision = await state.store.schema_revision()
    except (OperationalError, InterfaceError, OSError, StoreUnavailable):
        checks["store"] = "unreachable"
        checks["schema"] = "unknown (the store is unreachable)"
    else:
        checks["store"] = OK
        head = head_revision()
        checks["schema"] = (
            OK
            if revision == head
            else f"at revision {revision or 'none'}; this server needs {head}"
        )
    if state.wakeups_listening is not None:
        listening = state.wakeups_listening.is_set()
        checks["wakeups"] = OK if listening else "not listening for other replicas' wake-ups"
    return checks
