"""``GET /v1/dist``: the server's own wheel, which launched machines install
(:mod:`lakeshore.distribution`), so that every daemon runs the server's exact code."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Response

from lakeshore.api.deps import Caller
from lakeshore.distribution import own_wheel
from lakeshore.errors import NotFound

router = APIRouter(prefix="/v1/dist", tags=["health"])

WHEEL_TYPE = "application/octet-stream"


@router.get("", summary="The wheel this server runs: its file name, version and SHA-256")
async def describe(caller: Caller) -> dict[str, Any]:
    wheel = await asyncio.to_thread(own_wheel)
    return {
        "filename": wheel.filename,
        "version": wheel.version,
        "sha256": wheel.sha256,
        "size": len(wheel.data),
        "url": f"/v1/dist/{wheel.filename}",
    }


@router.get(
    "/{filename}",
    summary="Download the wheel this server runs (any token, a launched daemon's included)",
    response_class=Response,
    responses={200: {"content": {WHEEL_TYPE: {}}, "description": "The wheel"}},
)
async def download(filename: str, caller: Caller) -> Response:
    wheel = await asyncio.to_thread(own_wheel)
    if filename != wheel.filename:
        raise NotFound(f"this server serves {wheel.filename}, not {filename}")
    return Response(
        wheel.data,
        media_type=WHEEL_TYPE,
        headers={
            "Content-Disposition": f'attachment; filename="{wheel.filename}"',
            "X-Checksum-Sha256": wheel.sha256,
        },
    )
