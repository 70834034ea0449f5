"""Namespaces and their tokens."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import RowMapping, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from lakeshore.store import ui_sessions
from lakeshore.store.tables import namespaces, tokens


async def get_by_name(conn: AsyncConnection, name: str) -> RowMapping | None:
    result = await conn.execute(select(namespaces).where(namespaces.c.name == name))
    return result.mappings().first()


async def list_all(conn: AsyncConnection) -> list[RowMapping]:
    result = await conn.execute(select(namespaces).order_by(namespaces.c.name))
    return list(result.mappings())


async def insert_namespace(conn: AsyncConnection, *, id: str, name: str, now: datetime) -> None:
    await conn.execute(insert(namespaces).values(id=id, name=name, created_at=now))


async def insert_token(
    conn: AsyncConnection,
    *,
    id: str,
    namespace_id: str,
    kind: str,
    secret_hash: str,
    now: datetime,
    name: str | None = None,
    worker_id: str | None = None,
) -> None:
    await conn.execute(
        insert(tokens).values(
            id=id,
            namespace_id=namespace_id,
            kind=kind,
            name=name,
            secret_hash=secret_hash,
            worker_id=worker_id,
            created_at=now,
        )
    )


async def insert_tokens(conn: AsyncConnection, rows: Sequence[dict[str, Any]]) -> None:
    """Insert many tokens in one statement (rows carry every column but ``revoked_at``)."""
    if rows:
        await conn.execute(insert(tokens), list(rows))


async def get_token(conn: AsyncConnection, token_id: str) -> RowMapping | None:
    """A live (unrevoked) token with its namespace's name."""
    query = (
        select(tokens, namespaces.c.name.label("namespace_name"))
        .join(namespaces, namespaces.c.id == tokens.c.namespace_id)
        .where(tokens.c.id == token_id, tokens.c.revoked_at.is_(None))
    )
    return (await conn.execute(query)).mappings().first()


async def bind_token(conn: AsyncConnection, token_id: str, worker_id: str) -> bool:
    """Bind a worker token to the one worker it may act for: True when it is now bound to
    ``worker_id`` (or already was), False when it is bound to another. One statement, so
    two hellos racing with one token cannot both win."""
    done = await conn.execute(
        update(tokens)
        .where(tokens.c.id == token_id)
        .where(or_(tokens.c.worker_id.is_(None), tokens.c.worker_id == worker_id))
        .values(worker_id=worker_id)
    )
    return done.rowcount == 1


async def revoke_token(conn: AsyncConnection, token_id: str, now: datetime) -> None:
    await conn.execute(update(tokens).where(tokens.c.id == token_id).values(revoked_at=now))


TOKEN_FIELDS = (tokens.c.id, tokens.c.name, tokens.c.created_at, tokens.c.revoked_at)


async def namespace_tokens(conn: AsyncConnection, namespace_id: str) -> list[RowMapping]:
    """A namespace's own tokens (not those minted for launched daemons), live and
    revoked, oldest first; never their digests."""
    query = (
        select(*TOKEN_FIELDS)
        .where(tokens.c.namespace_id == namespace_id, tokens.c.kind == "namespace")
        .order_by(tokens.c.created_at, tokens.c.id)
    )
    return list((await conn.execute(query)).mappings())


async def revoke_namespace_token(
    conn: AsyncConnection, namespace_id: str, token_id: str, now: datetime
) -> RowMapping | None:
    """Revoke one of the namespace's own tokens (a second revoke keeps the first time);
    the token as it is now, or None when the namespace has no such token."""
    mine = (
        tokens.c.id == token_id,
        tokens.c.namespace_id == namespace_id,
        tokens.c.kind == "namespace",
    )
    await conn.execute(
        update(tokens).where(*mine, tokens.c.revoked_at.is_(None)).values(revoked_at=now)
    )
    token = (await conn.execute(select(*TOKEN_FIELDS).where(*mine))).mappings().first()
    if token is not None:  # its dashboard sessions end with it
        await ui_sessions.delete_for_token(conn, token_id)
    return token
