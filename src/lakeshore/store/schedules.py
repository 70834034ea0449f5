"""The schedules table: a queue's periodic schedules and the last slot each dealt with."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import RowMapping, bindparam, delete, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from lakeshore.store.tables import invocations, namespaces, queues, schedules

C = schedules.c


async def insert_schedule(conn: AsyncConnection, row: dict[str, Any]) -> RowMapping:
    await conn.execute(insert(schedules).values(row))
    found = await get_by_id(conn, row["id"])
    assert found is not None
    return found


async def get_by_id(conn: AsyncConnection, schedule_id: str) -> RowMapping | None:
    return (await conn.execute(select(schedules).where(C.id == schedule_id))).mappings().first()


async def get_schedule(
    conn: AsyncConnection, queue_id: str, name: str, *, lock: bool = False
) -> RowMapping | None:
    """A queue's schedule by name; ``lock`` (PostgreSQL) holds its row to the commit."""
    query = select(schedules).where(C.queue_id == queue_id, C.name == name)
    if lock and conn.dialect.name == "postgresql":
        query = query.with_for_update()
    return (await conn.execute(query)).mappings().first()


async def list_for_queue(conn: AsyncConnection, queue_id: str) -> Sequence[RowMapping]:
    query = select(schedules).where(C.queue_id == queue_id).order_by(C.name)
    return (await conn.execute(query)).mappings().all()


async def update_schedule(
    conn: AsyncConnection,
    schedule_id: str,
    *,
    spec: dict[str, Any],
    enabled: bool,
    now: datetime,
    last_slot: datetime | None = None,
) -> None:
    values: dict[str, Any] = {"spec": spec, "enabled": enabled, "updated_at": now}
    if last_slot is not None:
        values["last_slot"] = last_slot
    await conn.execute(update(schedules).where(C.id == schedule_id).values(values))


async def delete_schedule(conn: AsyncConnection, schedule_id: str) -> None:
    await conn.execute(delete(schedules).where(C.id == schedule_id))


async def all_schedules(conn: AsyncConnection) -> Sequence[RowMapping]:
    """Every schedule (paused ones too: their last slot moves on while they are paused),
    with its queue's name and state and its namespace's name: the leader's sweep."""
    query = (
        select(
            schedules,
            queues.c.name.label("queue_name"),
            queues.c.state.label("queue_state"),
            namespaces.c.name.label("namespace_name"),
        )
        .join(queues, queues.c.id == C.queue_id)
        .join(namespaces, namespaces.c.id == C.namespace_id)
        .order_by(C.id)
    )
    return (await conn.execute(query)).mappings().all()


_MARK = (
    update(invocations)
    .where(invocations.c.id == bindparam("made_id"), invocations.c.schedule.is_(None))
    .values(schedule=bindparam("made_by"), slot=bindparam("made_for"))
)


async def mark_made(
    conn: AsyncConnection, schedule: str, made: Sequence[tuple[str, datetime]]
) -> None:
    """Write on each invocation (id, slot) the schedule and slot it was submitted for."""
    if made:
        rows = [{"made_id": id_, "made_by": schedule, "made_for": slot} for id_, slot in made]
        await conn.execute(_MARK, rows)


async def advance(conn: AsyncConnection, schedule_id: str, *, was: datetime, to: datetime) -> bool:
    """Move the last slot from ``was`` to ``to``; false when another writer moved it
    first (two leaders for a moment): that one's enqueues stand, these are the same
    invocations by their keys."""
    result = await conn.execute(
        update(schedules).where(C.id == schedule_id, C.last_slot == was).values(last_slot=to)
    )
    return bool(result.rowcount)
