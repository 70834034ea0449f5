"""Liveness and readiness in one: 200 when the store answers, 503 when it does not."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from lakeshore import __version__
from lakeshore.api.deps import State

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Health check (no token needed)")
async def healthz(state: State) -> dict[str, Any]:
    await state.store.ping()
    return {"status": "ok", "version": __version__, "database": state.store.dialect}
