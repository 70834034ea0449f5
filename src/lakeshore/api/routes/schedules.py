"""A queue's periodic schedules: create, list, read, PATCH, delete."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Response

from lakeshore.api.deps import InNamespace, State
from lakeshore.api.routes.queues import JsonOnly
from lakeshore.domain import schedules as rules
from lakeshore.services.taskqueue import schedules as schedule_service

router = APIRouter(prefix="/v1/namespaces/{ns}/queues/{queue}/schedules", tags=["schedules"])

RawBody = Annotated[Any, Body()]


def _body(schema: dict[str, Any]) -> dict[str, Any]:
    content = {"application/json": {"schema": schema}}
    return {"requestBody": {"required": True, "content": content}}


@router.get("", summary="List a queue's schedules, by name")
async def list_schedules(queue: str, ns: InNamespace, state: State) -> dict[str, Any]:
    found = await schedule_service.list_for_queue(state.store, ns, queue)
    now = state.clock()
    return {"schedules": [schedule.to_json(now) for schedule in found]}


@router.post(
    "",
    status_code=201,
    summary="Create a schedule",
    dependencies=[JsonOnly],
    openapi_extra=_body(rules.json_schema()),
)
async def create_schedule(
    queue: str, ns: InNamespace, state: State, body: RawBody
) -> dict[str, Any]:
    now = state.clock()
    return (await schedule_service.create(state.store, ns, queue, body, now)).to_json(now)


@router.get("/{name}", summary="Read a schedule, with its last and next slot")
async def get_schedule(queue: str, name: str, ns: InNamespace, state: State) -> dict[str, Any]:
    schedule = await schedule_service.get(state.store, ns, queue, name)
    return schedule.to_json(state.clock())


@router.patch(
    "/{name}",
    summary="Change a schedule: each field given replaces it (enabled: false pauses it)",
    dependencies=[JsonOnly],
    openapi_extra=_body(rules.json_schema(patch=True)),
)
async def patch_schedule(
    queue: str, name: str, ns: InNamespace, state: State, body: RawBody
) -> dict[str, Any]:
    now = state.clock()
    return (await schedule_service.patch(state.store, ns, queue, name, body, now)).to_json(now)


@router.delete("/{name}", status_code=204, summary="Delete a schedule")
async def delete_schedule(queue: str, name: str, ns: InNamespace, state: State) -> Response:
    await schedule_service.delete(state.store, ns, queue, name)
    return Response(status_code=204)
