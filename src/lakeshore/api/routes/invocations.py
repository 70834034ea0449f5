"""Invocations, client side: submit (one or a batch), read, list, cancel."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Query, Response

from lakeshore.api.deps import InNamespace, State
from lakeshore.services import invocations as inv_service

router = APIRouter(prefix="/v1/namespaces/{ns}", tags=["invocations"])

WaitS = Annotated[
    float,
    Query(ge=0, le=60, description="A full queue with on_full: block is waited on this long"),
]
StateFilter = Literal["pending", "running", "succeeded", "failed", "cancelled", "expired"]


@router.post(
    "/queues/{name}/invocations",
    summary="Submit an invocation (a missing queue is created as fifo)",
    responses={200: {"description": "the key was used before: the invocation holding it"}},
    status_code=201,
)
async def submit(
    name: str,
    ns: InNamespace,
    state: State,
    response: Response,
    body: Annotated[Any, Body()],
    wait_s: WaitS = 10.0,
) -> dict[str, Any]:
    [(invocation, created)] = await inv_service.submit_many(
        state.store, state.notifier, state.limiter, ns, name, [body], state.clock(), block_s=wait_s
    )
    if not created:
        response.status_code = 200
    return invocation


@router.post(
    "/queues/{name}/invocations/batch",
    summary="Submit up to 1,000 invocations in one request, in order",
    status_code=201,
)
async def submit_batch(
    name: str, ns: InNamespace, state: State, body: Annotated[Any, Body()], wait_s: WaitS = 10.0
) -> dict[str, Any]:
    items = body.get("invocations") if isinstance(body, dict) else None
    if not isinstance(items, list):
        items = []
    results = await inv_service.submit_many(
        state.store, state.notifier, state.limiter, ns, name, items, state.clock(), block_s=wait_s
    )
    return {
        "invocations": [invocation for invocation, _ in results],
        "created": [created for _, created in results],
    }


@router.get("/queues/{name}/invocations", summary="List a queue's invocations, newest first")
async def list_invocations(
    name: str,
    ns: InNamespace,
    state: State,
    states: Annotated[list[StateFilter] | None, Query(alias="state")] = None,
    limit: Annotated[int, Query(ge=1, le=inv_service.MAX_PAGE)] = inv_service.DEFAULT_PAGE,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> dict[str, Any]:
    return await inv_service.list_for_queue(
        state.store, ns, name, states=states or [], limit=limit, cursor=cursor
    )


@router.get("/invocations/{invocation_id}", summary="Read an invocation")
async def get_invocation(invocation_id: str, ns: InNamespace, state: State) -> dict[str, Any]:
    return await inv_service.get(state.store, ns, invocation_id)


@router.post(
    "/invocations/{invocation_id}/cancel", summary="Cancel a pending or running invocation"
)
async def cancel_invocation(invocation_id: str, ns: InNamespace, state: State) -> dict[str, Any]:
    return await inv_service.cancel(state.store, ns, invocation_id, state.clock())
