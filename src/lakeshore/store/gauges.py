"""What ``GET /metrics`` reads of the store at a scrape: per queue, its invocations by
state, its oldest pending one, its daemons, its launches in flight and its hysteresis
counters — five grouped queries in one read, whatever the number of queues."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import case, func, literal_column, select
from sqlalchemy.ext.asyncio import AsyncConnection

from lakeshore.store import claimable
from lakeshore.store import controller as ctl_store
from lakeshore.store.tables import invocations, launches, namespaces, queues

INV = invocations.c
Q = queues.c
L = launches.c

COUNTED_STATES = ("pending", "running")


@dataclass(frozen=True)
class QueueGauges:
    namespace: str
    queue: str
    state: str  # the queue's: active, paused, draining
    pending: int = 0  # a delayed submit not due yet is not pending but scheduled
    running: int = 0
    scheduled: int = 0
    oldest_pending_at: datetime | None = None
    daemons: int = 0
    capacity: int = 0  # the daemons' max_invocations, summed
    launches_in_flight: int = 0  # a pooled queue's: its pool's
    namespace_id: str = ""
    scope: str = ""  # the queue's name, or ``pool:<name>`` for a queue in a pool
    consecutive_above: int = 0  # the scope's hysteresis counters (pool_with_threshold)
    consecutive_below: int = 0


async def read(conn: AsyncConnection, now: datetime | None = None) -> list[QueueGauges]:
    """Every queue that is not archived, by namespace and name, at ``now`` (what is due;
    by default the wall clock's, a scrape's moment)."""
    named = select(
        Q.id, Q.namespace_id, Q.name, Q.state, Q.pool, namespaces.c.name.label("namespace")
    ).join(namespaces, namespaces.c.id == Q.namespace_id)
    rows = (
        await conn.execute(named.where(Q.state != "archived").order_by("namespace", Q.name))
    ).all()
    counts: dict[tuple[str, str], int] = {}
    oldest: dict[str, datetime] = {}
    # a delayed submit not due yet counts as scheduled, not pending (store/claimable.py)
    at = datetime.now(UTC) if now is None else now
    as_counted = case((claimable.scheduled(at), literal_column("'scheduled'")), else_=INV.state)
    rows_by_state = (
        select(INV.queue_id, as_counted.label("counted"), INV.created_at)
        .where(INV.state.in_(COUNTED_STATES))
        .subquery()
    )
    g = rows_by_state.c
    by_state = select(g.queue_id, g.counted, func.count(), func.min(g.created_at)).group_by(
        g.queue_id, g.counted
    )
    for queue_id, state, n, first in (await conn.execute(by_state)).all():
        counts[(queue_id, state)] = int(n)
        if state == "pending":
            oldest[queue_id] = first
    heads = await ctl_store.headcount(conn)
    in_flight = (
        select(L.namespace_id, L.scope, func.count())
        .where(L.state == "in_flight")
        .group_by(L.namespace_id, L.scope)
    )
    flying = {(ns, scope): int(n) for ns, scope, n in (await conn.execute(in_flight)).all()}
    counters = await ctl_store.load_counters(conn)
    gauges = []
    for queue_id, namespace_id, name, state, pool, namespace in rows:
        daemons, capacity = heads.get(queue_id, (0, 0))
        scope = f"pool:{pool}" if pool else name
        counted = counters.get((namespace_id, scope))
        gauges.append(
            QueueGauges(
                namespace=namespace,
                queue=name,
                state=state,
                pending=counts.get((queue_id, "pending"), 0),
                running=counts.get((queue_id, "running"), 0),
                scheduled=counts.get((queue_id, "scheduled"), 0),
                oldest_pending_at=oldest.get(queue_id),
                daemons=daemons,
                capacity=capacity,
                launches_in_flight=flying.get((namespace_id, scope), 0),
                namespace_id=namespace_id,
                scope=scope,
                consecutive_above=counted.above if counted else 0,
                consecutive_below=counted.below if counted else 0,
            )
        )
    return gauges


async def queue_names(
    conn: AsyncConnection, queue_ids: Sequence[str]
) -> dict[str, tuple[str, str]]:
    """Queue id → (namespace name, queue name), for the ids that exist."""
    if not queue_ids:
        return {}
    query = (
        select(Q.id, namespaces.c.name, Q.name)
        .join(namespaces, namespaces.c.id == Q.namespace_id)
        .where(Q.id.in_(list(queue_ids)))
    )
    return {queue_id: (ns, name) for queue_id, ns, name in (await conn.execute(query)).all()}


async def namespace_name(conn: AsyncConnection, namespace_id: str) -> str | None:
    query = select(namespaces.c.name).where(namespaces.c.id == namespace_id)
    return (await conn.execute(query)).scalar_one_or_none()
