"""Queue records and the counts read off them."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import bindparam, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from lakeshore.domain.queue import Queue, QueueSpec
from lakeshore.domain.states import QueueState
from lakeshore.store.rows import queue_columns, queue_from_row
from lakeshore.store.tables import invocations, queues

OPEN_STATES = ("pending", "running")


async def insert_queue(
    conn: AsyncConnection, *, id: str, namespace_id: str, spec: QueueSpec, now: datetime
) -> Queue:
    values = {
        "id": id,
        "namespace_id": namespace_id,
        "state": "active",
        "created_at": now,
        "updated_at": now,
        **queue_columns(spec),
    }
    await conn.execute(insert(queues).values(**values))
    return Queue(
        id=id, namespace_id=namespace_id, spec=spec, state="active", created_at=now, updated_at=now
    )


# built once: a submit reads its queue every time, and building the statement cost more
# than running it
_BY_NAME = select(queues).where(
    queues.c.namespace_id == bindparam("namespace_id"), queues.c.name == bindparam("name")
)
_BY_NAME_LOCKED = _BY_NAME.with_for_update()


async def get_queue(
    conn: AsyncConnection, namespace_id: str, name: str, *, lock: bool = False
) -> Queue | None:
    """The queue by name. ``lock`` (PostgreSQL) holds its row until the transaction ends:
    submits to one queue then take turns, so a depth check and the insert it admits are
    not interleaved with another submit's, nor with a state change (draining)."""
    found = await get_queue_at(conn, namespace_id, name, lock=lock)
    return found[0] if found else None


async def get_queue_at(
    conn: AsyncConnection, namespace_id: str, name: str, *, lock: bool = False
) -> tuple[Queue, int] | None:
    """:func:`get_queue`, with the row's ``revision`` (which every write of its spec or
    state moves): what a copy of the queue kept elsewhere is checked against."""
    query = _BY_NAME_LOCKED if lock and conn.dialect.name == "postgresql" else _BY_NAME
    found = await conn.execute(query, {"namespace_id": namespace_id, "name": name})
    row = found.mappings().first()
    return (queue_from_row(row), row["revision"]) if row else None


async def list_queues(
    conn: AsyncConnection,
    namespace_id: str,
    *,
    include_archived: bool = False,
    after: str | None = None,
    limit: int | None = None,
) -> list[Queue]:
    """The namespace's queues by name: all of them, or a page of ``limit`` names after
    ``after`` (keyset paging, on the ``(namespace_id, name)`` unique index)."""
    query = select(queues).where(queues.c.namespace_id == namespace_id)
    if not include_archived:
        query = query.where(queues.c.state != "archived")
    if after is not None:
        query = query.where(queues.c.name > after)
    query = query.order_by(queues.c.name)
    if limit is not None:
        query = query.limit(limit)
    return [queue_from_row(row) for row in (await conn.execute(query)).mappings()]


async def update_spec(conn: AsyncConnection, queue: Queue, spec: QueueSpec, now: datetime) -> Queue:
    await conn.execute(
        update(queues)
        .where(queues.c.id == queue.id)
        .values(updated_at=now, revision=queues.c.revision + 1, **queue_columns(spec))
    )
    return queue.model_copy(update={"spec": spec, "updated_at": now})


async def update_state(
    conn: AsyncConnection, queue: Queue, state: QueueState, now: datetime
) -> Queue:
    await conn.execute(
        update(queues)
        .where(queues.c.id == queue.id)
        .values(state=state, updated_at=now, revision=queues.c.revision + 1)
    )
    return queue.model_copy(update={"state": state, "updated_at": now})


_PENDING = select(func.count()).where(
    invocations.c.queue_id == bindparam("queue_id"), invocations.c.state == "pending"
)


async def pending_count(conn: AsyncConnection, queue_id: str) -> int:
    return int((await conn.execute(_PENDING, {"queue_id": queue_id})).scalar_one())
