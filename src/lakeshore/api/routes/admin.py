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
        "With several servers on one PostgreSQL, only the controller's leader may tick."
    ),
)
async def tick(state: State, caller: Caller) -> dict[str, Any]:
    caller.require_admin("run a controller tick")
    if not await state.leadership.try_lead():
        raise Conflict(
            "another server runs the elasticity controller; run the tick there "
            "(or wait: it ticks every ELASTICITY_INTERVAL_S)"
        )
    return {"decisions": await state.controller.tick()}
