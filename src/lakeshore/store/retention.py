"""The retention sweep's SQL: finished invocations (with their stream items) and decision
events past their window, deleted one bounded batch per call.

Each call is meant to be its own transaction, short whatever the size of the backlog:
it picks at most ``limit`` rows through an index that holds only candidates
(``ix_invocations_finished``: a queue's finished invocations by ``finished_at``;
``ix_elasticity_events_created_at``), so it reads the rows it deletes and nothing that
a claim or a submit is working on (pending and running rows are not in the index).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import Select, bindparam, delete, func, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from lakeshore.store import streams, tallies
from lakeshore.store.tables import FINISHED, elasticity_events, invocations, queues
from lakeshore.store.tallies import STATES

INV = invocations.c
E = elasticity_events.c


async def queue_windows(conn: AsyncConnection) -> dict[str, float | None]:
    """Every queue's own ``retention_s`` (None: the server's), by queue id."""
    rows = await conn.execute(select(queues.c.id, queues.c.retention_s))
    return {queue_id: retention for queue_id, retention in rows.all()}


def finished_batch(queue_id: str, before: datetime, limit: int) -> Select[str, str, datetime]:
    """The ids, states and ends of the queue's next batch: finished before ``before``,
    oldest first (read through ``ix_invocations_finished``, whose condition it repeats
    word for word)."""
    return (
        select(INV.id, INV.state, INV.finished_at)
        .where(INV.queue_id == queue_id, text(FINISHED), INV.finished_at < before)
        .order_by(INV.finished_at)
        .limit(limit)
    )


# of the rows a batch deleted, those of one state the queue's tally had counted (a row
# deleted before the leader tallied it was never in the tally)
_TALLIED_GONE = (
    "SELECT count(*) FROM gone WHERE state = '{state}' "
    "AND finished_at <= finished_tallies.counted_until"
)

# PostgreSQL: the batch in one statement, its ids never shipped to the server and back
# (a batch of 1,000 took 10 ms instead of 23 as three statements; bench/retention.py)
DELETE_FINISHED_PG = text(
    f"""
    WITH picked AS (
        SELECT id FROM invocations
        WHERE queue_id = :queue_id AND {FINISHED} AND finished_at < :before
        ORDER BY finished_at LIMIT :limit
    ), items AS (
        DELETE FROM stream_items WHERE invocation_id IN (SELECT id FROM picked) RETURNING 1
    ), gone AS (
        DELETE FROM invocations WHERE id IN (SELECT id FROM picked) AND {FINISHED}
        RETURNING state, finished_at
    ), tally AS (
        UPDATE finished_tallies SET
        {", ".join(f"{s} = {s} - ({_TALLIED_GONE.format(state=s)})" for s in STATES)}
        WHERE queue_id = :queue_id RETURNING 1
    )
    SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM items), (SELECT count(*) FROM tally)
    """
).bindparams(bindparam("before", type_=INV.finished_at.type))


async def delete_finished(
    conn: AsyncConnection, queue_id: str, before: datetime, *, limit: int
) -> tuple[int, int]:
    """Delete up to ``limit`` of the queue's invocations that finished before ``before``,
    oldest first, and their stream items, and take those its tally had counted off it
    (:mod:`lakeshore.store.tallies`; the others ``stats`` read live). (invocations,
    stream items) deleted."""
    if conn.dialect.name == "postgresql":
        params = {"queue_id": queue_id, "before": before, "limit": limit}
        gone, items, _ = (await conn.execute(DELETE_FINISHED_PG, params)).one()
        return int(gone), int(items)
    found = (await conn.execute(finished_batch(queue_id, before, limit))).all()
    if not found:
        return 0, 0
    ids: Sequence[str] = [str(i) for i, _, _ in found]
    items = await streams.delete_of(conn, ids)
    done = await conn.execute(delete(invocations).where(INV.id.in_(ids), text(FINISHED)))
    until = await tallies.counted_until(conn, queue_id)
    by_state: dict[str, int] = {}
    for _, state, finished_at in found:  # one writer on SQLite: found is what went
        if until is not None and finished_at <= until:
            by_state[state] = by_state.get(state, 0) + 1
    await tallies.take_off(conn, queue_id, by_state)
    return int(done.rowcount), items


async def delete_events(
    conn: AsyncConnection, before: datetime, *, limit: int, noops_only: bool = False
) -> int:
    """Delete up to ``limit`` decision events last decided before ``before`` (a folded
    no-op counts from its last tick, ``last_at``), oldest first; ``noops_only``: only
    no-ops. How many went."""
    last = func.coalesce(E.last_at, E.created_at)
    picked = select(E.id).where(E.created_at < before, last < before)
    if noops_only:
        # written out, as ix_elasticity_events_noop_age's condition is: the index serves it
        picked = picked.where(text("action = 'tick_noop'"))
    ids = (await conn.execute(picked.order_by(E.created_at).limit(limit))).scalars().all()
    if not ids:
        return 0
    done = await conn.execute(delete(elasticity_events).where(E.id.in_(ids)))
    return int(done.rowcount)


# the tables whose rows the live path updates and the sweep deletes: their dead row
# versions are what a vacuum makes room of
CHURNED = ("invocations", "stream_items", "workers", "elasticity_events")


async def vacuumed_by_the_server(conn: AsyncConnection) -> bool:
    """Whether the database cleans up dead rows by itself (PostgreSQL's ``autovacuum``;
    SQLite reuses a deleted row's pages without it)."""
    if conn.dialect.name != "postgresql":
        return True
    return str((await conn.execute(text("SHOW autovacuum"))).scalar_one()) == "on"


async def vacuum(conn: AsyncConnection) -> None:
    """``VACUUM`` the churned tables (PostgreSQL; ``conn`` in autocommit): their dead
    rows' room is used again, without locking out reads or writes."""
    await conn.execute(text(f"VACUUM (ANALYZE) {', '.join(CHURNED)}"))
