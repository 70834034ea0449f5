"""Operator routes (the admin token): run a controller tick now."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from lakeshore.api.deps import Caller, State
from lakeshore.errors import Conflict

router = APIRouter(prefix="/v1/admin", tags=["admin"])


@router.post(
    "/elasticity/tick",
    summary="Run one elasticity tick now and return its decisions (admin)",
    description=(
        "One decision per active queue and pool, each also written to its events feed. "
        "With several servers on one PostgreSQL, a server ticks the unpinned queues only "
        "while it leads the controller, and the queues pinned to its own node id "
        "(`serverNodeId`). On a server whose loop is off (`ELASTICITY_ENABLED=false`), the "
        "leadership taken for this tick is let go when it ends."
    ),
)
async def tick(state: State, caller: Caller) -> dict[str, Any]:
    caller.require_admin("run a controller tick")
    led = await state.leadership.try_lead()
    try:
        if not led.anything:
            raise Conflict(
                "another server runs the elasticity controller; run the tick there "
                "(or wait: it ticks every ELASTICITY_INTERVAL_S)"
            )
        return {"decisions": await state.controller.tick(led)}
    finally:
        if not state.settings.elasticity_enabled:  # no loop here to keep leading for
            await state.leadership.release()
