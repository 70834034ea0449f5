"""The scale feed and "why didn't it scale": what the controller decided, and why.

Every tick writes one event per queue or pool (no-ops included); the feed shows the
decisions that did something unless asked for everything (``verbose``). A pooled queue's
feed includes its pool's events, since the pool is what ticks. ``explain`` puts the
latest decision next to the signals and rule behind it and what would have to change.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from lakeshore.domain import fleet, scaling
from lakeshore.domain.names import is_valid_name
from lakeshore.elasticity import plan, units
from lakeshore.errors import InvalidInput, NotFound
from lakeshore.services import queues as queue_service
from lakeshore.services.fleet import scopes
from lakeshore.services.namespaces import Namespace
from lakeshore.store import events as event_store
from lakeshore.store import queues as queue_store
from lakeshore.store.engine import Store

DEFAULT_PAGE = 50
MAX_PAGE = 500
MAX_EVENT_ID = 2**63 - 1  # event ids are BIGINTs (SQLite: its 64-bit integer)


def event_json(row: Any) -> dict[str, Any]:
    detail = dict(row["signals"] or {})
    return {
        "id": row["id"],
        "queueName": row["queue_name"],  # the spec's name: a queue's, or "pool:<name>"
        "scope": row["queue_name"],  # the same, as earlier servers named it
        "action": row["action"],
        "reason": row["reason"],
        "before": row["before"],
        "after": row["after"],
        "rule": detail.pop("rule", None),
        "hint": detail.pop("hint", None),
        "detail": detail,
        "createdAt": row["created_at"].isoformat(),
        # consecutive identical no-ops share a row: how many ticks, and the last one's time
        "repeats": row["repeats"],
        "lastAt": (row["last_at"] or row["created_at"]).isoformat(),
    }


def _cursor(cursor: str | None) -> int | None:
    if cursor is None:
        return None
    if not cursor.isascii() or not cursor.isdigit() or int(cursor) > MAX_EVENT_ID:
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
    named = sorted({queue.name, scopes.scope_of(queue)})
    return await _page(store, ns, named, verbose=verbose, limit=limit, cursor=cursor, since=since)


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


async def explain(
    store: Store, ns: Namespace, name: str, now: datetime, *, by_state: bool = True
) -> dict[str, Any]:
    """The latest decision for the queue (or its pool), its signals, the rule, what
    would have to change for it to scale, and what the next tick would decide now.

    Everything but the latest decision comes from the plan's step for the queue's scope
    (:mod:`.scopes`), the controller's own code. A queue in an ``elasticity.pool`` does
    not tick by itself: its pool does, with the policy of the pool's first active member
    and the provider of the first member that names one. The answer gives those (not the
    queue's own), the pool's members, and a line for each member whose policy the pool
    ignores. ``by_state=False`` leaves out the queue's counts of every state (``byState``
    is then None), which read all of its invocations."""
    queue, reading, counts = await queue_service.read_scope(store, ns, name, now, by_state=by_state)
    step = reading.step
    pool_name = queue.spec.elasticity.pool if queue.spec.elasticity else None
    async with store.read() as conn:
        row = await event_store.latest(conn, ns.id, reading.scope)
    latest = event_json(row) if row is not None else None
    pool: dict[str, Any] | None = None
    if pool_name is not None:
        members = [fleet.QueueView.from_queue(q) for q in step.unit.members]
        pool = {
            "name": pool_name,
            "feed": fleet.pool_audit_name(pool_name),
            "members": reading.members,
            "policyFrom": step.unit.policy_queue.name,
            "providerFrom": step.unit.launch_from.name,
            "disagreements": fleet.pool_disagreements(members),
        }
    decision = step.decision
    return {
        "queue": queue.name,
        "scope": reading.scope,
        "state": queue.state,
        "pool": pool,
        "policy": _policy_json(step.policy),
        "provider": units.provider_of(step.unit),
        "now": queue_service.stats_json(
            queue, reading, counts, await queue_service.scheduled_of(store, queue, now)
        ),
        "next": None
        if step.scaler is not None
        else {
            "action": decision.action,
            "reason": decision.reason,
            "rule": decision.rule,
            "hint": decision.hint,
            # a wait_target decision's estimates, each with its source
            "estimates": plan.estimates_json(step) if decision.estimates else None,
        },
        "latest": latest,
        "ageSeconds": round((now - row["created_at"]).total_seconds(), 1) if row else None,
        "why": _why(queue.state, latest, pool_name),
    }


def _policy_json(policy: scaling.Policy) -> dict[str, Any]:
    return {
        "kind": policy.kind,
        "min": policy.min,
        "max": policy.max,
        "threshold": policy.high,
        "threshold_low": policy.low,
        "reservedSlots": policy.reserved_slots,
        "max_step": policy.max_step,
        "wait_s": policy.wait_s,
    }


def _why(state: str, latest: dict[str, Any] | None, pool: str | None) -> str:
    if state != "active":
        also = f' (pool "{pool}" ticks without it)' if pool else ""
        return f"the queue is {state}: the controller ticks active queues only{also}"
    if latest is None:
        return (
            "no tick has decided for this queue yet (is the controller running? "
            "ELASTICITY_ENABLED; or run `lakeshore controller tick`)"
        )
    if latest["action"] != "tick_noop":
        return f"it scaled: {latest['reason']}"
    return str(latest["hint"] or latest["reason"])
