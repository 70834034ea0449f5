"""A queue's invocations by state, read in time that does not grow with its history.

A queue's live invocations (pending, running) are few and read through the claim's
index. Its finished ones are added up by the leading server into ``finished_tallies``
(:func:`roll_up`), up to ``counted_until``, a moment a little in the past
(:data:`~lakeshore.domain.retention.TALLY_LAG_S`), so that a finish stamped before that
moment has committed by the time it is counted. :func:`counts` reads, in one statement
(one snapshot), the live rows, the tally and only the rows finished after
``counted_until``, through ``ix_invocations_finished``.

The tally holds while every row it counted stays as it was counted: the retention sweep
takes the counted rows it deletes off it in the same statement (a row deleted before it
was counted was only ever read live: :mod:`lakeshore.store.retention`); a retry that puts
a counted row back in its queue takes it off in its own transaction (:func:`take_back`).
It assumes one clock for ``finished_at`` that does not step back past ``counted_until``
(the database's clock on PostgreSQL: :mod:`lakeshore.store.dbclock`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime

from sqlalchemy import TextClause, bindparam, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection

from lakeshore.store.tables import FINISHED, finished_tallies, invocations
from lakeshore.store.upsert import locked_row

T = finished_tallies.c
C = invocations.c
STATES = ("succeeded", "failed", "cancelled", "expired")
NEVER = datetime(1970, 1, 1, tzinfo=UTC)  # counted_until before the first roll-up

_TALLIED = " UNION ALL ".join(
    f"SELECT '{s}', {s} FROM finished_tallies WHERE queue_id = :queue_id" for s in STATES
)
_UNTIL = "(SELECT counted_until FROM finished_tallies WHERE queue_id = :queue_id)"
# the finished rows are read through ix_invocations_finished, whose condition is repeated
# word for word; SQLite is told so (INDEXED BY): its planner took the per-state index and
# read every finished row of the queue
_FINISHED_INDEX = "ix_invocations_finished"


def _counts(indexed_by: str) -> TextClause:
    return text(
        f"""
        SELECT state, count(*) FROM invocations
        WHERE queue_id = :queue_id AND state IN ('pending', 'running') GROUP BY state
        UNION ALL
        SELECT state, count(*) FROM invocations {indexed_by}
        WHERE queue_id = :queue_id AND {FINISHED}
          AND finished_at > COALESCE({_UNTIL}, :never)
        GROUP BY state
        UNION ALL
        {_TALLIED}
        """
    ).bindparams(bindparam("never", NEVER, type_=C.finished_at.type))


_COUNTS = {"postgresql": _counts(""), "sqlite": _counts(f"INDEXED BY {_FINISHED_INDEX}")}


def _finished_since(indexed_by: str) -> TextClause:
    return text(
        f"""
        SELECT state, count(*) FROM invocations {indexed_by}
        WHERE queue_id = :queue_id AND {FINISHED}
          AND finished_at > :after AND finished_at <= :upto
        GROUP BY state
        """
    ).bindparams(
        bindparam("after", type_=C.finished_at.type), bindparam("upto", type_=C.finished_at.type)
    )


_FINISHED_SINCE = {
    "postgresql": _finished_since(""),
    "sqlite": _finished_since(f"INDEXED BY {_FINISHED_INDEX}"),
}


async def counts(conn: AsyncConnection, queue_id: str) -> dict[str, int]:
    """The queue's invocations by state (states with none are absent): every row it has,
    however many finished, read as one snapshot."""
    found: dict[str, int] = {}
    query = _COUNTS[conn.dialect.name]
    for state, count in (await conn.execute(query, {"queue_id": queue_id})).all():
        if count:
            found[state] = found.get(state, 0) + int(count)
    return found


async def roll_up(conn: AsyncConnection, queue_id: str, upto: datetime) -> datetime:
    """Add the queue's invocations finished after its tally's ``counted_until`` and at or
    before ``upto`` to its tally, which then counts until ``upto`` (never back): the new
    ``counted_until``. The tally's row is locked for the transaction."""
    row = await locked_row(conn, finished_tallies, {"queue_id": queue_id}, {"counted_until": NEVER})
    until: datetime = row.counted_until
    if upto <= until:
        return until
    params = {"queue_id": queue_id, "after": until, "upto": upto}
    query = _FINISHED_SINCE[conn.dialect.name]
    added = {state: int(n) for state, n in (await conn.execute(query, params)).all()}
    await conn.execute(
        update(finished_tallies)
        .where(T.queue_id == queue_id)
        .values(counted_until=upto, **{s: T[s] + added[s] for s in added if s in STATES})
    )
    return upto


async def counted_until(conn: AsyncConnection, queue_id: str) -> datetime | None:
    """Until when the queue's tally counts (None: it has none yet)."""
    query = select(T.counted_until).where(T.queue_id == queue_id)
    value: datetime | None = (await conn.execute(query)).scalar_one_or_none()
    return value


async def take_back(conn: AsyncConnection, ids: Iterable[str], states: Iterable[str]) -> None:
    """Before those of invocations ``ids`` in ``states`` (finished ones) are put back in
    their queues (a retry): lock them and their queues' tallies, and take off the
    tallies those already counted."""
    ids, states = list(ids), list(states)
    if not ids:
        return
    queue_ids = select(C.queue_id).where(C.id.in_(ids)).distinct()
    await conn.execute(select(T.queue_id).where(T.queue_id.in_(queue_ids)).with_for_update())
    await conn.execute(select(C.id).where(C.id.in_(ids)).with_for_update())
    counted = (
        select(C.queue_id, C.state, text("count(*)"))
        .select_from(invocations.join(finished_tallies, T.queue_id == C.queue_id))
        .where(C.id.in_(ids), C.state.in_(states), C.finished_at <= T.counted_until)
        .group_by(C.queue_id, C.state)
    )
    by_queue: dict[str, dict[str, int]] = {}
    for queue_id, state, n in (await conn.execute(counted)).all():
        by_queue.setdefault(str(queue_id), {})[str(state)] = int(n)
    for queue_id, gone in by_queue.items():
        await take_off(conn, queue_id, gone)


async def take_off(conn: AsyncConnection, queue_id: str, gone: Mapping[str, int]) -> None:
    """Take ``gone`` (finished invocations by state, all counted) off the queue's tally."""
    values = {s: T[s] - n for s, n in gone.items() if s in STATES and n}
    if values:
        await conn.execute(update(finished_tallies).where(T.queue_id == queue_id).values(**values))
