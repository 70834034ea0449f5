"""Invocations, client side: submit (one or a batch), read, list, cancel."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any, Literal

from fastapi import Body, Depends, Header, Query, Request, Response
from fastapi.sse import EventSourceResponse, ServerSentEvent
from pydantic import BaseModel, ConfigDict

from lakeshore.api import head, lean
from lakeshore.api.answers import json_answer
from lakeshore.api.deps import (
    Caller,
    InNamespace,
    State,
    Submit,
    Submitting,
    bearer_token,
    submitting_as,
)
from lakeshore.errors import InvalidInput
from lakeshore.services.taskqueue import invocations as inv_service
from lakeshore.services.taskqueue import streams as stream_service

router = lean.Router(prefix="/v1/namespaces/{ns}", tags=["invocations"])

WaitS = Annotated[
    float,
    Query(ge=0, le=60, description="A full queue with on_full: block is waited on this long"),
]
StateFilter = Literal["pending", "running", "succeeded", "failed", "cancelled", "expired"]


Answer = Literal["invocations", "ids"]
_WAIT_S = lean.seconds_within(60)
Endpoint = Callable[..., Awaitable[Response]]


async def _read(request: Request, known: dict[str, lean.QueryValue]) -> dict[str, Any] | None:
    """A submit's arguments (the queue's name, who submits to which namespace, the body,
    the query's parameters among ``known``), read as the framework would, or ``None``
    (see :mod:`lakeshore.api.lean`)."""
    read = lean.query(request.scope["query_string"], known)
    if read is None:
        return None
    body = await lean.json_body(request)
    if body is lean.UNREAD:
        return None
    params = request.path_params
    to = await submitting_as(params["ns"], request, bearer_token(request))
    return {"name": params["name"], "to": to, "body": body, **read}


def _submits(
    path: str, known: dict[str, lean.QueryValue], **options: Any
) -> Callable[[Endpoint], Endpoint]:
    """Register a submit route (``POST path``, 201), whose requests :func:`_read`
    reads where it can, with the query parameters ``known``."""

    async def reader(request: Request) -> dict[str, Any] | None:
        return await _read(request, known)

    def register(endpoint: Endpoint) -> Endpoint:
        router.add_api_route(
            path,
            endpoint,
            methods=["POST"],
            status_code=201,
            response_model=dict[str, Any],
            route_class_override=lean.route(reader),
            **options,
        )
        return endpoint

    return register


@_submits(
    "/queues/{name}/invocations",
    {"wait_s": _WAIT_S},
    summary="Submit an invocation (a missing queue is created as fifo)",
    responses={200: {"description": "the key was used before: the invocation holding it"}},
)
async def submit(
    name: str,
    to: Submit,
    body: Annotated[Any, Body()],
    wait_s: WaitS = 10.0,
) -> Response:
    [(invocation, created)] = await _submitted(to, name, [body], wait_s, waiting=True)
    return json_answer(invocation, 201 if created else 200)


@_submits(
    "/queues/{name}/invocations/batch",
    {"wait_s": _WAIT_S, "answer": lean.one_of("invocations", "ids")},
    summary="Submit up to 1,000 invocations in one request, in order",
)
async def submit_batch(
    name: str,
    to: Submit,
    body: Annotated[Any, Body()],
    wait_s: WaitS = 10.0,
    answer: Annotated[
        Answer,
        Query(
            description=(
                "`invocations` (the default): each invocation whole; `ids`: each only as "
                '`{"id": …}`, a tenth of the answer when the caller needs only the ids'
            )
        ),
    ] = "invocations",
) -> Response:
    items = body.get("invocations") if isinstance(body, dict) else None
    ids_only = answer == "ids"
    results = await _submitted(to, name, items if isinstance(items, list) else [], wait_s, ids_only)
    invocations = [invocation for invocation, _ in results]
    return json_answer({"invocations": invocations, "created": [c for _, c in results]}, 201)


async def _submitted(
    to: Submitting,
    name: str,
    bodies: list[Any],
    wait_s: float,
    ids_only: bool = False,
    *,
    waiting: bool = False,
) -> list[tuple[dict[str, Any], bool]]:
    """The submits made (one per body, in order), counted; ``waiting``: a single submit
    may be handed to a claim waiting in this server."""
    state = to.state
    results = await inv_service.submit_many(
        state.store,
        state.notifier,
        to.ns,
        name,
        bodies,
        state.clock(),
        block_s=wait_s,
        ids_only=ids_only,
        max_payload_bytes=state.settings.max_payload_bytes,
        caller=to.caller,
        known=state.queues,
        waiting=state.waiting if waiting else None,
    )
    made = sum(1 for _, created in results if created)
    if made:
        state.metrics.submitted.labels(to.ns.name, name).inc(made)
    return results


@router.get("/queues/{name}/invocations", summary="List a queue's invocations, newest first")
async def list_invocations(
    name: str,
    ns: InNamespace,
    state: State,
    caller: Caller,
    states: Annotated[list[StateFilter] | None, Query(alias="state")] = None,
    limit: Annotated[int, Query(ge=1, le=inv_service.MAX_PAGE)] = inv_service.DEFAULT_PAGE,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> dict[str, Any]:
    return await inv_service.list_for_queue(
        state.store, ns, name, states=states or [], limit=limit, cursor=cursor, caller=caller
    )


@router.get("/invocations/{invocation_id}", summary="Read an invocation")
async def get_invocation(
    invocation_id: str, ns: InNamespace, state: State, caller: Caller
) -> dict[str, Any]:
    return await inv_service.get(state.store, ns, invocation_id, caller)


@router.post(
    "/invocations/{invocation_id}/cancel", summary="Cancel a pending or running invocation"
)
async def cancel_invocation(
    invocation_id: str, ns: InNamespace, state: State, caller: Caller
) -> dict[str, Any]:
    return await inv_service.cancel(
        state.store, state.notifier, ns, invocation_id, state.clock(), caller, state.metrics
    )


async def _existing_invocation(
    invocation_id: str, ns: InNamespace, state: State, caller: Caller
) -> str:
    """404 (403 by the queue's authPolicy) before the stream starts, not a broken stream."""
    await stream_service.require(state.store, ns, invocation_id, caller)
    return invocation_id


async def _resume_after(
    after: Annotated[
        int, Query(ge=-1, le=stream_service.MAX_SEQ, description="Start after this item number")
    ] = -1,
    last_event_id: Annotated[str | None, Header(max_length=20)] = None,
) -> int:
    """The item number to start after: ``after`` or ``Last-Event-ID``, whichever is later
    (a Last-Event-ID that is no number is ignored, as a stream's own ids are numbers).
    422 before the stream starts for one past any item number."""
    if last_event_id is None or not (last_event_id.isascii() and last_event_id.strip().isdigit()):
        return after
    resumed = int(last_event_id)
    if resumed > stream_service.MAX_SEQ:
        raise InvalidInput(
            f"Last-Event-ID is an item number, at most {stream_service.MAX_SEQ}",
            field="last-event-id",
        )
    return max(after, resumed)


@router.post(
    "/invocations/{invocation_id}/retry",
    summary="Retry a failed, expired or cancelled invocation (same id and key, a new attempt)",
    responses={409: {"description": "pending, running or succeeded: nothing to retry"}},
)
async def retry_invocation(
    invocation_id: str, ns: InNamespace, state: State, caller: Caller
) -> dict[str, Any]:
    return await inv_service.retry(
        state.store, state.notifier, ns, invocation_id, state.clock(), caller
    )


class BulkBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    state: StateFilter


@router.post(
    "/queues/{name}/invocations/retry",
    summary="Retry every failed (or expired, or cancelled) invocation of a queue",
)
async def retry_all(
    name: str, ns: InNamespace, state: State, caller: Caller, body: BulkBody
) -> dict[str, int]:
    touched = await inv_service.bulk(
        state.store,
        state.notifier,
        ns,
        name,
        "retry",
        body.state,
        state.clock(),
        caller,
        state.metrics,
    )
    return {"touched": touched}


@router.post(
    "/queues/{name}/invocations/cancel",
    summary="Cancel every pending (or running) invocation of a queue",
)
async def cancel_all(
    name: str, ns: InNamespace, state: State, caller: Caller, body: BulkBody
) -> dict[str, int]:
    touched = await inv_service.bulk(
        state.store,
        state.notifier,
        ns,
        name,
        "cancel",
        body.state,
        state.clock(),
        caller,
        state.metrics,
    )
    return {"touched": touched}


@router.get(
    "/invocations/{invocation_id}/stream",
    summary="Follow a generator invocation's items as server-sent events, then its end",
    description=(
        "Each yielded item is an `item` event (its `id` is the item's number, from 0, and "
        "its data the item as JSON); the stream ends with one `end` event holding the "
        "invocation in its final state. Resume with `Last-Event-ID` or `after`."
    ),
    response_class=EventSourceResponse,
)
async def stream_invocation(
    invocation_id: Annotated[str, Depends(_existing_invocation)],
    ns: InNamespace,
    state: State,
    request: Request,
    after: Annotated[int, Depends(_resume_after)],
) -> AsyncIterator[ServerSentEvent]:
    if head.headers_only(request):
        return  # a HEAD: the headers are the answer, no items are read
    async for event in stream_service.follow(
        state.store, state.notifier, ns, invocation_id, after_seq=after, stopping=state.stopping
    ):
        yield ServerSentEvent(
            event=event.kind, data=event.data, id=None if event.seq is None else str(event.seq)
        )
