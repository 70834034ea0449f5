"""The scale feed and "why didn't it scale": what the controller decided, and why.

Every tick writes one event per queue or pool (no-ops included); the feed shows the
decisions that did something unless asked for everything (``verbose``). A pooled queue's
feed includes its pool's events, since the pool is what ticks. ``explain`` puts the
latest decision next to the signals and rule behind it and what would have to change.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from lakeshore.domain import scaling
from lakeshore.domain.names import is_valid_name
from lakeshore.errors import InvalidInput, NotFound
from lakeshore.services import queues as queue_service
from lakeshore.services.namespaces import Namespace
from lakeshore.store import events as event_store
from lakeshore.store import queues as queue_store
from lakeshore.store.engine import Store

DEFAULT_PAGE = 50
MAX_PAGE = 500


def event_json(row: Any) -> dict[str, Any]:
    detail = dict(row["signals"] or {})
    return {
        "id": row["id"],
        "scope": row["queue_name"],
        "action": row["action"],
        "reason": row["reason"],
        "before": row["before"],
        "after": row["after"],
        "rule": detail.pop("rule", None),
        "hint": detail.pop("hint", None),
        "detail": detail,
        "createdAt": row["created_at"].isoformat(),
    }


def _cursor(cursor: str | None) -> int | None:
    if cursor is None:
        return None
    if not cursor.isdigit() or len(cursor) > 19:
        raise InvalidInput("not a cursor this server issued", field="cursor")
    return int(cursor)


async def _page(
    store: Store,
    ns: Namespace,
    scopes: list[str],
    *,
    verbose: bool,
    limit: int,
    cursor: str | None,
    since: int | None,
) -> dict[str, Any]:
    async with store.read() as conn:
        rows = await event_store.feed(
            conn,
            ns.id,
            scopes,
            verbose=verbose,
            limit=limit,
            before_id=_cursor(cursor),
            after_id=since,
        )
    next_cursor = str(rows[-1]["id"]) if len(rows) == limit else None
    return {"events": [event_json(row) for row in rows], "next_cursor": next_cursor}


async def queue_events(
    store: Store,
    ns: Namespace,
    name: str,
    *,
    verbose: bool = False,
    limit: int = DEFAULT_PAGE,
    cursor: str | None = None,
    since: int | None = None,
) -> dict[str, Any]:
    queue = await queue_service.get(store, ns, name)
    scopes = sorted({queue.name, queue_service.scope_of(queue)})
    return await _page(store, ns, scopes, verbose=verbose, limit=limit, cursor=cursor, since=since)


async def pool_events(
    store: Store,
    ns: Namespace,
    pool: str,
    *,
    verbose: bool = False,
    limit: int = DEFAULT_PAGE,
    cursor: str | None = None,
    since: int | None = None,
) -> dict[str, Any]:
    async with store.read() as conn:
        members = await queue_store.list_queues(conn, ns.id, include_archived=True)
    if not is_valid_name(pool) or not any(
        q.spec.elasticity and q.spec.elasticity.pool == pool for q in members
    ):
        raise NotFound(f'no queue in this namespace is in pool "{pool}"', field="pool")
    return await _page(
        store, ns, [f"pool:{pool}"], verbose=verbose, limit=limit, cursor=cursor, since=since
    )


async def explain(store: Store, ns: Namespace, name: str, now: datetime) -> dict[str, Any]:
    """The latest decision for the queue (or its pool), its signals, the rule, and what
    would have to change for it to scale."""
    queue = await queue_service.get(store, ns, name)
    stats = await queue_service.stats(store, ns, name)
    scope = queue_service.scope_of(queue)
    async with store.read() as conn:
        row = await event_store.latest(conn, ns.id, scope)
    policy = scaling.Policy.from_elasticity(queue.spec.elasticity)
    latest = event_json(row) if row is not None else None
    answer: dict[str, Any] = {
        "queue": queue.name,
        "scope": scope,
        "state": queue.state,
        "policy": {
            "kind": policy.kind,
            "min": policy.min,
            "max": policy.max,
            "threshold": policy.high,
            "threshold_low": policy.low,
        },
        "provider": queue.spec.provider_ref
        or (queue.spec.daemon_template.provider if queue.spec.daemon_template else None),
        "now": stats,
        "latest": latest,
        "ageSeconds": round((now - row["created_at"]).total_seconds(), 1) if row else None,
        "why": _why(queue.state, latest),
    }
    return answer


def _why(state: str, latest: dict[str, Any] | None) -> str:
    if state != "active":
        return f"the queue is {state}: the controller ticks active queues only"
    if latest is None:
        return (
            "no tick has decided for this queue yet (is the controller running? "
            "ELASTICITY_ENABLED; or run `lakeshore controller tick`)"
        )
    if latest["action"] != "tick_noop":
        return f"it scaled: {latest['reason']}"
    return str(latest["hint"] or latest["reason"])
