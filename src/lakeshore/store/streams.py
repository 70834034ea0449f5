"""Stream items: what a generator UDF yielded, numbered from 0 in the order it yielded.

Appends are idempotent per ``(invocation, seq)``: a daemon that retries a post, or a
retried attempt that yields again from the start, never stores an item twice; the first
item stored under a number is the one readers see.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from lakeshore.store.tables import stream_items

C = stream_items.c


async def append(
    conn: AsyncConnection, invocation_id: str, first_seq: int, items: Sequence[Any], now: datetime
) -> None:
    if not items:
        return
    dialect_insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
    rows = [
        {"invocation_id": invocation_id, "seq": first_seq + i, "item": item, "created_at": now}
        for i, item in enumerate(items)
    ]
    await conn.execute(dialect_insert(stream_items).on_conflict_do_nothing(), rows)


async def read_after(
    conn: AsyncConnection, invocation_id: str, after_seq: int, *, limit: int
) -> list[tuple[int, Any]]:
    """Items numbered above ``after_seq``, in order, at most ``limit``."""
    query = (
        select(C.seq, C.item)
        .where(C.invocation_id == invocation_id, C.seq > after_seq)
        .order_by(C.seq)
        .limit(limit)
    )
    return [(int(seq), item) for seq, item in (await conn.execute(query)).all()]


async def count(conn: AsyncConnection, invocation_id: str) -> int:
    query = select(func.count()).where(C.invocation_id == invocation_id)
    return int((await conn.execute(query)).scalar_one())


async def delete_of(conn: AsyncConnection, invocation_ids: Sequence[str]) -> int:
    """Delete the items of these invocations (the retention sweep, before the invocations
    themselves): how many went."""
    if not invocation_ids:
        return 0
    done = await conn.execute(delete(stream_items).where(C.invocation_id.in_(invocation_ids)))
    return int(done.rowcount)
