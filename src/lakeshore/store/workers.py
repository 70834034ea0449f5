"""Worker rows, their queue memberships, and the ids retired for good."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import RowMapping, delete, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from lakeshore.store.tables import queues, retired_workers, worker_queues, workers

W = workers.c


async def is_retired(conn: AsyncConnection, worker_id: str) -> bool:
    query = select(retired_workers.c.id).where(retired_workers.c.id == worker_id)
    return (await conn.execute(query)).first() is not None


async def get(conn: AsyncConnection, worker_id: str) -> RowMapping | None:
    return (await conn.execute(select(workers).where(W.id == worker_id))).mappings().first()


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


async def touch(conn: AsyncConnection, worker_id: str, now: datetime) -> None:
    await conn.execute(update(workers).where(W.id == worker_id).values(last_seen_at=now))


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


async def drop_silent(conn: AsyncConnection, cutoff: datetime) -> list[str]:
    """Remove workers not seen since ``cutoff`` (their leases expire on their own)."""
    gone = list((await conn.execute(select(W.id).where(W.last_seen_at < cutoff))).scalars())
    if gone:
        await conn.execute(delete(workers).where(W.id.in_(gone)))
    return gone
