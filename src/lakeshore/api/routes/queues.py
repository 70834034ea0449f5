"""Queue records: create, list, read, PATCH, lifecycle transitions, stats."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Query, Request

from lakeshore.api.deps import InNamespace, State
from lakeshore.domain.states import TRANSITIONS, Transition
from lakeshore.errors import UnsupportedMediaType
from lakeshore.services import queues as queue_service
from lakeshore.services.taskqueue import schedules as schedule_service

router = APIRouter(prefix="/v1/namespaces/{ns}/queues", tags=["queues"])

QUEUE_SPEC_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/QueueSpec"}}},
    }
}
QUEUE_PATCH_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/QueuePatch"}}},
    }
}


async def _json_only(request: Request) -> None:
    """Queue bodies are JSON: another declared media type is 415, not a confusing 422."""
    declared = request.headers.get("content-type")
    if declared is None:
        return
    media = declared.split(";", 1)[0].strip().lower()
    if media != "application/json" and not (
        media.startswith("application/") and media.endswith("+json")
    ):
        raise UnsupportedMediaType(f"send the queue as application/json, not {media or 'nothing'}")


RawBody = Annotated[Any, Body()]
JsonOnly = Depends(_json_only)


@router.get("", summary="List queues by name, a page at a time (archived ones only when asked)")
async def list_queues(
    ns: InNamespace,
    state: State,
    include_archived: Annotated[bool, Query(description="Include archived queues")] = False,
    limit: Annotated[
        int, Query(ge=1, le=queue_service.MAX_PAGE, description="Most queues in the page")
    ] = queue_service.DEFAULT_PAGE,
    cursor: Annotated[
        str | None, Query(max_length=200, description="next_cursor of a page")
    ] = None,
) -> dict[str, Any]:
    page = await queue_service.list_page(
        state.store, ns, include_archived=include_archived, limit=limit, cursor=cursor
    )
    return {"queues": [queue.to_json() for queue in page.queues], "next_cursor": page.next_cursor}


@router.post(
    "",
    status_code=201,
    summary="Create a queue",
    openapi_extra=QUEUE_SPEC_BODY,
    dependencies=[JsonOnly],
)
async def create_queue(ns: InNamespace, state: State, body: RawBody) -> dict[str, Any]:
    queue = await queue_service.create(
        state.store, ns, body, state.clock(), scalers=state.controller.scalers
    )
    return queue.to_json()


@router.get("/{name}", summary="Read a queue")
async def get_queue(name: str, ns: InNamespace, state: State) -> dict[str, Any]:
    return (await queue_service.get(state.store, ns, name)).to_json()


@router.patch(
    "/{name}",
    summary="Change a queue: each field given replaces that field whole; null clears it",
    openapi_extra=QUEUE_PATCH_BODY,
    dependencies=[JsonOnly],
)
async def patch_queue(name: str, ns: InNamespace, state: State, body: RawBody) -> dict[str, Any]:
    queue = await queue_service.patch(
        state.store, ns, name, body, state.clock(), scalers=state.controller.scalers
    )
    return queue.to_json()


@router.get("/{name}/stats", summary="The queue's signals: pending, running, daemons, utilization")
async def queue_stats(name: str, ns: InNamespace, state: State) -> dict[str, Any]:
    answer = await queue_service.stats(state.store, ns, name, state.clock())
    # each of the queue's periodic schedules and its next slot
    answer["schedules"] = await schedule_service.next_slots(state.store, ns, name, state.clock())
    return answer


def _transition_route(action: Transition) -> None:
    async def move(name: str, ns: InNamespace, state: State) -> dict[str, Any]:
        queue = await queue_service.transition(state.store, ns, name, action, state.clock())
        return queue.to_json()

    move.__name__ = f"{action}_queue"
    router.add_api_route(
        f"/{{name}}/{action}", move, methods=["POST"], summary=f"{action.capitalize()} a queue"
    )


for _action in TRANSITIONS:
    _transition_route(_action)
