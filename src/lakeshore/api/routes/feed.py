"""The scale feed: a queue's or pool's elasticity events, and ``explain``."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from lakeshore.api.deps import InNamespace, State
from lakeshore.services.fleet import feed
from lakeshore.services.taskqueue import schedules as schedule_service

router = APIRouter(prefix="/v1/namespaces/{ns}", tags=["elasticity"])

Verbose = Annotated[bool, Query(description="Include tick_noop decisions")]
Limit = Annotated[int, Query(ge=1, le=feed.MAX_PAGE)]
Cursor = Annotated[str | None, Query(max_length=20, description="next_cursor of a page")]
Since = Annotated[
    int | None,
    Query(ge=0, le=feed.MAX_EVENT_ID, description="Only events newer than this id (for following)"),
]


@router.get(
    "/queues/{name}/events",
    summary="The queue's scale decisions, newest first (its pool's too)",
)
async def queue_events(
    name: str,
    ns: InNamespace,
    state: State,
    verbose: Verbose = False,
    limit: Limit = feed.DEFAULT_PAGE,
    cursor: Cursor = None,
    since: Since = None,
) -> dict[str, Any]:
    return await feed.queue_events(
        state.store, ns, name, verbose=verbose, limit=limit, cursor=cursor, since=since
    )


@router.get("/pools/{pool}/events", summary="A pool's scale decisions, newest first")
async def pool_events(
    pool: str,
    ns: InNamespace,
    state: State,
    verbose: Verbose = False,
    limit: Limit = feed.DEFAULT_PAGE,
    cursor: Cursor = None,
    since: Since = None,
) -> dict[str, Any]:
    return await feed.pool_events(
        state.store, ns, pool, verbose=verbose, limit=limit, cursor=cursor, since=since
    )


@router.get(
    "/queues/{name}/explain",
    summary="Why the queue did (or did not) scale: the latest decision, its rule and signals",
)
async def explain(name: str, ns: InNamespace, state: State) -> dict[str, Any]:
    answer = await feed.explain(state.store, ns, name, state.clock())
    if isinstance(answer.get("now"), dict):  # its stats, as GET …/stats gives them
        now = answer["now"]
        now["schedules"] = await schedule_service.next_slots(state.store, ns, name, state.clock())
    return answer
