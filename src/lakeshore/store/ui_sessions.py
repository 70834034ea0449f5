"""The dashboard's sessions: a keyed hash of each session id, the token it stands for
(null for the admin token) and when it ends."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import RowMapping, and_, delete, insert, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from lakeshore.store.tables import namespaces, tokens, ui_sessions


async def insert_session(
    conn: AsyncConnection,
    *,
    id_hash: str,
    token_id: str | None,
    now: datetime,
    expires_at: datetime,
) -> None:
    await conn.execute(
        insert(ui_sessions).values(
            id_hash=id_hash, token_id=token_id, created_at=now, expires_at=expires_at
        )
    )


async def get_live(conn: AsyncConnection, id_hash: str, now: datetime) -> RowMapping | None:
    """A session that has not ended by ``now`` and whose token is not revoked, with its
    token's columns as :func:`lakeshore.store.namespaces.get_token` reads them (``id``
    null: the admin token's)."""
    live_token = and_(tokens.c.id == ui_sessions.c.token_id, tokens.c.revoked_at.is_(None))
    query = (
        select(
            tokens.c.id,
            tokens.c.namespace_id,
            tokens.c.kind,
            tokens.c.name,
            tokens.c.worker_id,
            namespaces.c.name.label("namespace_name"),
        )
        .select_from(
            ui_sessions.outerjoin(tokens, live_token).outerjoin(
                namespaces, namespaces.c.id == tokens.c.namespace_id
            )
        )
        .where(
            ui_sessions.c.id_hash == id_hash,
            ui_sessions.c.expires_at > now,
            or_(ui_sessions.c.token_id.is_(None), tokens.c.id.is_not(None)),
        )
    )
    return (await conn.execute(query)).mappings().first()


async def delete_session(conn: AsyncConnection, id_hash: str) -> None:
    await conn.execute(delete(ui_sessions).where(ui_sessions.c.id_hash == id_hash))


async def delete_for_token(conn: AsyncConnection, token_id: str) -> None:
    """End every session of a token (it is being revoked)."""
    await conn.execute(delete(ui_sessions).where(ui_sessions.c.token_id == token_id))


async def delete_expired(conn: AsyncConnection, now: datetime, limit: int) -> int:
    """Delete up to ``limit`` sessions that ended by ``now``: how many went."""
    ended = (
        select(ui_sessions.c.id_hash)
        .where(ui_sessions.c.expires_at <= now)
        .order_by(ui_sessions.c.expires_at)
        .limit(limit)
    )
    done = await conn.execute(delete(ui_sessions).where(ui_sessions.c.id_hash.in_(ended)))
    return done.rowcount
