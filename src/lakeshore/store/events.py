"""Reading the scale feed: a queue's or pool's elasticity events, newest first."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import RowMapping, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from lakeshore.store.tables import elasticity_events

E = elasticity_events.c


async def feed(
    conn: AsyncConnection,
    namespace_id: str,
    scopes: Sequence[str],
    *,
    verbose: bool,
    limit: int,
    before_id: int | None = None,
    after_id: int | None = None,
) -> list[RowMapping]:
    """Events of ``scopes`` (queue names and ``pool:<name>``), newest first; no-ops only
    when ``verbose``. ``before_id`` pages back, ``after_id`` follows new ones."""
    query = select(elasticity_events).where(
        E.namespace_id == namespace_id, E.queue_name.in_(list(scopes))
    )
    if not verbose:
        query = query.where(E.action != "tick_noop")
    if before_id is not None:
        query = query.where(E.id < before_id)
    if after_id is not None:
        query = query.where(E.id > after_id)
    query = query.order_by(E.id.desc()).limit(limit)
    return list((await conn.execute(query)).mappings())


async def latest(conn: AsyncConnection, namespace_id: str, scope: str) -> RowMapping | None:
    query = (
        select(elasticity_events)
        .where(E.namespace_id == namespace_id, E.queue_name == scope)
        .order_by(E.id.desc())
        .limit(1)
    )
    return (await conn.execute(query)).mappings().first()


async def latest_everywhere(conn: AsyncConnection) -> dict[tuple[str, str], RowMapping]:
    """The newest event of every scope of every namespace, by (namespace id, scope): one
    grouped query, whatever the number of queues."""
    newest = select(func.max(E.id)).group_by(E.namespace_id, E.queue_name)
    query = select(elasticity_events).where(E.id.in_(newest))
    rows = (await conn.execute(query)).mappings()
    return {(row["namespace_id"], row["queue_name"]): row for row in rows}
