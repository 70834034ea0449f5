"""Worker rows, their queue memberships, and the ids retired for good."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from psycopg.rows import dict_row
from sqlalchemy import (
    RowMapping,
    bindparam,
    delete,
    exists,
    false,
    func,
    insert,
    select,
    text,
    true,
    union_all,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import Select
from sqlalchemy.sql.elements import BindParameter

from lakeshore.store.driver import psycopg_of, psycopg_text
from lakeshore.store.tables import (
    PENDING_KEYED,
    invocations,
    launches,
    queues,
    retired_workers,
    worker_queues,
    workers,
)

W = workers.c
_DISPATCHING = ("active", "draining")
_SUBSCRIBED = (*_DISPATCHING, "paused")  # own queues: paused ones count for the steal delay


async def is_retired(conn: AsyncConnection, worker_id: str) -> bool:
    """Whether the worker with this key was retired."""
    query = select(retired_workers.c.id).where(retired_workers.c.id == worker_id)
    return (await conn.execute(query)).first() is not None


async def is_retired_name(conn: AsyncConnection, namespace_id: str, name: str) -> bool:
    """Whether the namespace retired a worker of this id."""
    r = retired_workers.c
    query = select(r.id).where(r.namespace_id == namespace_id, r.name == name)
    return (await conn.execute(query)).first() is not None


async def key_taken(conn: AsyncConnection, key: str) -> bool:
    """Whether a worker, live or retired, of any namespace has this key."""
    return await get(conn, key) is not None or await is_retired(conn, key)


# the statements every request of a worker runs, built once (building one per call cost
# about as much as running it)
_GET = select(workers).where(W.id == bindparam("b_id"))
_TOUCH = (
    update(workers)
    .where(W.id == bindparam("b_id"))
    .values(last_seen_at=bindparam("b_now", type_=W.last_seen_at.type))
    .returning(W.retiring)
)


async def get(conn: AsyncConnection, worker_id: str) -> RowMapping | None:
    """The worker with this key."""
    return (await conn.execute(_GET, {"b_id": worker_id})).mappings().first()


async def get_by_name(conn: AsyncConnection, namespace_id: str, name: str) -> RowMapping | None:
    """The namespace's worker of this id."""
    query = select(workers).where(W.namespace_id == namespace_id, W.name == name)
    return (await conn.execute(query)).mappings().first()


async def only_by_name(conn: AsyncConnection, name: str) -> RowMapping | None:
    """The one worker of any namespace with this id (None when none, or several)."""
    rows = (await conn.execute(select(workers).where(W.name == name).limit(2))).mappings().all()
    return rows[0] if len(rows) == 1 else None


async def upsert(
    conn: AsyncConnection, *, values: dict[str, Any], queue_ids: Sequence[str], now: datetime
) -> None:
    """Register or refresh a worker and replace its queue memberships."""
    worker_id = values["id"]
    if await get(conn, worker_id) is None:
        await conn.execute(insert(workers).values(created_at=now, last_seen_at=now, **values))
    else:
        fields = {k: v for k, v in values.items() if k not in ("id", "namespace_id")}
        await conn.execute(
            update(workers).where(W.id == worker_id).values(last_seen_at=now, **fields)
        )
    await conn.execute(delete(worker_queues).where(worker_queues.c.worker_id == worker_id))
    if queue_ids:
        rows = [{"worker_id": worker_id, "queue_id": queue_id} for queue_id in queue_ids]
        await conn.execute(insert(worker_queues), rows)


_KEEP: Any = object()


async def touch(
    conn: AsyncConnection, worker_id: str, now: datetime, *, current: Any = _KEEP
) -> bool | None:
    """Mark the worker seen (and, given ``current``, store its report of the invocations
    it runs); True if it is retiring (it may claim nothing more), None if its row is gone.

    The update locks the worker's row for the rest of the transaction, so a claim and the
    controller's retire check of the same worker never interleave.
    """
    if current is _KEEP:
        done = await conn.execute(_TOUCH, {"b_id": worker_id, "b_now": now})
    else:
        values = {"last_seen_at": now, "current_invocations": current}
        done = await conn.execute(
            update(workers).where(W.id == worker_id).values(values).returning(W.retiring)
        )
    retiring = done.scalar_one_or_none()
    return None if retiring is None else bool(retiring)


async def subscribed_queues(conn: AsyncConnection, worker_id: str) -> list[RowMapping]:
    """The worker's queues that dispatch (active or draining), with what claims need."""
    query = (
        select(
            queues.c.id,
            queues.c.name,
            queues.c.kind,
            queues.c.kind_params,
            queues.c.admission,
            queues.c.state,
        )
        .select_from(worker_queues.join(queues, queues.c.id == worker_queues.c.queue_id))
        .where(worker_queues.c.worker_id == worker_id, queues.c.state.in_(("active", "draining")))
        .order_by(queues.c.name)
    )
    return list((await conn.execute(query)).mappings())


def _claimable_query() -> Select[Any]:
    """The statement :func:`claimable_queues` runs, built once (building it is most of
    its cost on the claim path), with ``worker_id`` and ``namespace_id`` bound per call."""
    q = queues.c
    worker_id: BindParameter[str] = bindparam("worker_id")
    columns = (
        q.id,
        q.name,
        q.kind,
        q.kind_params,
        q.admission,
        q.state,
        q.pool,
        q.elasticity,
        q.auth_policy,
    )
    membership = select(worker_queues.c.queue_id).where(worker_queues.c.worker_id == worker_id)
    own = (
        select(*columns, true().label("own"))
        .select_from(worker_queues.join(queues, q.id == worker_queues.c.queue_id))
        .where(worker_queues.c.worker_id == worker_id, q.state.in_(_SUBSCRIBED))
    )
    mine = queues.alias("mine")  # the worker's own queues again, for their pools
    own_pools = (
        select(mine.c.pool)
        .select_from(worker_queues.join(mine, mine.c.id == worker_queues.c.queue_id))
        .where(
            worker_queues.c.worker_id == worker_id,
            mine.c.state.in_(_DISPATCHING),
            mine.c.pool.is_not(None),
        )
    )
    siblings = select(*columns, false().label("own")).where(
        q.state.in_(_DISPATCHING),
        q.pool.in_(own_pools.scalar_subquery()),
        q.namespace_id == bindparam("namespace_id"),
        q.id.not_in(membership.scalar_subquery()),
    )
    both = union_all(own, siblings).subquery("claimable")
    return select(both).order_by(both.c.own.desc(), both.c.name)


_CLAIMABLE = _claimable_query()
# the same rows, each with the count of invocations the worker is running (one round
# trip less a claim: the count is read once, in the same statement), and whether the
# queue's pending rows have concurrency keys (``keyed``: a claim takes turns between
# them; one probe of ``ix_invocations_pending_key``, whose condition it repeats, which
# holds no entry of a queue without keys)
_CLAIMABLE_RUNNING = _CLAIMABLE.add_columns(
    select(func.count())
    .where(invocations.c.worker_id == bindparam("worker_id"), invocations.c.state == "running")
    .scalar_subquery()
    .label("running"),
    exists()
    .where(invocations.c.queue_id == _CLAIMABLE.selected_columns.id, text(PENDING_KEYED))
    .label("keyed"),
)


async def claimable_queues(
    conn: AsyncConnection, worker_id: str, namespace_id: str
) -> list[RowMapping]:
    """The worker's own queues (paused ones too, for their ``steal_delay_s``: claims
    take only from dispatching ones) and the pool siblings of its dispatching queues, in
    one query.

    A sibling is a dispatching (active or draining) queue of the worker's namespace that
    the worker does not subscribe to and whose ``pool`` is the pool of one of the
    worker's own dispatching queues. Each row has what claims need plus ``elasticity``
    (for the sibling's ``match`` and the own queues' ``steal_delay_s``) and ``own``
    (truthy for the worker's own queues). Own queues come first, each group by name.

    Both halves start from an index (the worker's memberships; queues by state and
    pool), so the cost follows the worker's queues and pools, not the namespace's size.
    """
    params = {"worker_id": worker_id, "namespace_id": namespace_id}
    return list((await conn.execute(_CLAIMABLE, params)).mappings())


async def claim_view(
    conn: AsyncConnection, worker_id: str, namespace_id: str
) -> tuple[int, list[RowMapping]]:
    """What a claim decides on, in one statement: how many invocations the worker is
    running, and :func:`claimable_queues`. With no claimable queue the count is not read
    (0): there is nothing to claim either way."""
    params = {"worker_id": worker_id, "namespace_id": namespace_id}
    rows = list((await conn.execute(_CLAIMABLE_RUNNING, params)).mappings())
    return (int(rows[0]["running"]) if rows else 0), rows


_TOUCH_PG, _ = psycopg_text(_TOUCH)
_CLAIMABLE_RUNNING_PG, _CLAIMABLE_FIXED = psycopg_text(_CLAIMABLE_RUNNING)


async def touch_and_view(
    conn: AsyncConnection, worker_id: str, namespace_id: str, now: datetime
) -> tuple[bool | None, int, list[Any]]:
    """:func:`touch`, then :func:`claim_view` (each row a mapping): what a claim starts
    with. On PostgreSQL both go out at once, behind the transaction's ``BEGIN``, in one
    round trip where they were three: pipelined, they still run one after the other, so
    the worker's row is locked (and any claim that held it committed) before its running
    count is read."""
    if conn.dialect.name != "postgresql":
        seen = await touch(conn, worker_id, now)
        if seen is None:
            return None, 0, []
        running, rows = await claim_view(conn, worker_id, namespace_id)
        return seen, running, rows
    driver = await psycopg_of(conn)
    view = {**_CLAIMABLE_FIXED, "worker_id": worker_id, "namespace_id": namespace_id}
    async with driver.pipeline():
        touched = await driver.execute(_TOUCH_PG, {"b_id": worker_id, "b_now": now})
        listed = driver.cursor(row_factory=dict_row)
        await listed.execute(_CLAIMABLE_RUNNING_PG, view)
    retiring = await touched.fetchone()
    if retiring is None:
        return None, 0, []
    found = await listed.fetchall()
    return bool(retiring[0]), (int(found[0]["running"]) if found else 0), found


async def idle_since(conn: AsyncConnection, worker_id: str) -> datetime | None:
    """When the worker last finished an invocation, or registered if that is later (or it
    never finished one); None if it is gone. Says nothing of what it runs right now:
    a worker holding a running invocation is busy, whatever this returns.

    Finished rows keep their ``worker_id`` (succeeded, failed for good, cancelled while
    held); a failure sent back for a retry clears it, so such an attempt leaves no mark.
    """
    last_finished = (
        select(func.max(invocations.c.finished_at))
        .where(invocations.c.worker_id == worker_id)
        .scalar_subquery()
    )
    query = select(W.created_at, last_finished.label("last_finished")).where(W.id == worker_id)
    row = (await conn.execute(query)).first()
    if row is None:
        return None
    created: datetime = row[0]
    finished: datetime | None = row[1]
    return created if finished is None else max(created, finished)


async def remove(conn: AsyncConnection, worker_id: str) -> None:
    await conn.execute(delete(workers).where(W.id == worker_id))


async def drop_silent(conn: AsyncConnection, cutoff: datetime) -> list[str]:
    """Remove workers not seen since ``cutoff`` (their leases expire on their own)."""
    gone = list((await conn.execute(select(W.id).where(W.last_seen_at < cutoff))).scalars())
    if gone:
        await conn.execute(delete(workers).where(W.id.in_(gone)))
    return gone


async def list_for_namespace(
    conn: AsyncConnection, namespace_id: str, queue_id: str | None = None
) -> list[dict[str, Any]]:
    """A namespace's workers (optionally those serving one queue) with their queue names,
    running invocations and launch, oldest first."""
    running = (
        select(invocations.c.worker_id, func.count().label("n"))
        .where(invocations.c.state == "running")
        .group_by(invocations.c.worker_id)
        .subquery()
    )
    query = (
        select(workers, func.coalesce(running.c.n, 0).label("running"))
        .outerjoin(running, running.c.worker_id == W.id)
        .where(W.namespace_id == namespace_id)
        .order_by(W.created_at, W.id)
    )
    if queue_id is not None:
        member = select(worker_queues.c.worker_id).where(worker_queues.c.queue_id == queue_id)
        query = query.where(W.id.in_(member))
    rows = [dict(row) for row in (await conn.execute(query)).mappings()]
    ids = [row["id"] for row in rows]
    names: dict[str, list[str]] = {worker_id: [] for worker_id in ids}
    providers: dict[str, str] = {}
    if ids:
        memberships = (
            select(worker_queues.c.worker_id, queues.c.name)
            .join(queues, queues.c.id == worker_queues.c.queue_id)
            .where(worker_queues.c.worker_id.in_(ids))
            .order_by(queues.c.name)
        )
        for worker_id, name in (await conn.execute(memberships)).all():
            names[worker_id].append(name)
        launched = select(launches.c.worker_id, launches.c.provider_name).where(
            launches.c.worker_id.in_(ids)
        )
        providers = {wid: name for wid, name in (await conn.execute(launched)).all()}
    for row in rows:
        row["queues"] = names[row["id"]]
        row["provider"] = providers.get(row["id"])
    return rows
