"""The manual fleet: launch daemons for a queue, list them, kill one."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Query

from lakeshore.api.deps import InNamespace, State
from lakeshore.services.fleet import daemons

router = APIRouter(prefix="/v1/namespaces/{ns}/daemons", tags=["daemons"])


@router.post(
    "",
    status_code=201,
    summary="Launch daemons for a queue through its provider (or the one named)",
    description=(
        'Body `{"queue", "provider"?, "count"? (1-100)}`. Each launch is tracked in flight '
        "until its daemon says hello, as the controller's are. 502 when every launch failed."
    ),
)
async def launch(ns: InNamespace, state: State, body: Annotated[Any, Body()]) -> dict[str, Any]:
    return await daemons.launch(state.store, state.controller.ops, ns, body)


@router.get("", summary="The namespace's daemons (workers), optionally of one queue")
async def list_daemons(
    ns: InNamespace,
    state: State,
    queue: Annotated[str | None, Query(max_length=63)] = None,
) -> dict[str, Any]:
    return await daemons.list_(state.store, ns, queue)


@router.delete(
    "/{worker_id}",
    summary="Retire an idle daemon (its provider stops it); 409 while it runs invocations",
)
async def kill(worker_id: str, ns: InNamespace, state: State) -> dict[str, Any]:
    return await daemons.kill(state.store, state.controller.ops, ns, worker_id)
