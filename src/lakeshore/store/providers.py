"""Provider registrations: ``{name, kind, config}`` per namespace, and who names them."""

from __future__ import annotations

import builtins
from collections.abc import Iterable
from datetime import datetime
from typing import Any, Final

from sqlalchemy import RowMapping, String, cast, or_, select, tuple_, update
from sqlalchemy import delete as sql_delete
from sqlalchemy import insert as sql_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from lakeshore.store.tables import providers, queues

P = providers.c
Q = queues.c

BY_NAMES_IN_LIMIT: Final = 500
"""Past this many keys ``by_names`` reads every registration and filters here: still one
query, without a statement of thousands of bound parameters."""


async def insert(
    conn: AsyncConnection,
    *,
    id: str,
    namespace_id: str,
    name: str,
    kind: str,
    config: dict[str, Any],
    now: datetime,
) -> RowMapping:
    values = {
        "id": id,
        "namespace_id": namespace_id,
        "name": name,
        "kind": kind,
        "config": config,
        "created_at": now,
        "updated_at": now,
    }
    await conn.execute(sql_insert(providers).values(**values))
    row = await get(conn, namespace_id, name)
    assert row is not None
    return row


async def set_config(
    conn: AsyncConnection, namespace_id: str, name: str, config: dict[str, Any], now: datetime
) -> None:
    """Replace a registration's config (validated by the caller)."""
    await conn.execute(
        update(providers)
        .where(providers.c.namespace_id == namespace_id, providers.c.name == name)
        .values(config=config, updated_at=now)
    )


async def get(conn: AsyncConnection, namespace_id: str, name: str) -> RowMapping | None:
    query = select(providers).where(P.namespace_id == namespace_id, P.name == name)
    return (await conn.execute(query)).mappings().first()


async def list(conn: AsyncConnection, namespace_id: str) -> builtins.list[RowMapping]:
    query = select(providers).where(P.namespace_id == namespace_id).order_by(P.name)
    return [*(await conn.execute(query)).mappings()]


async def delete(conn: AsyncConnection, namespace_id: str, name: str) -> bool:
    """Remove one registration; False if there was none."""
    done = await conn.execute(
        sql_delete(providers).where(P.namespace_id == namespace_id, P.name == name)
    )
    return bool(done.rowcount == 1)


async def by_names(
    conn: AsyncConnection, keys: Iterable[tuple[str, str]]
) -> dict[tuple[str, str], RowMapping]:
    """The registrations for many ``(namespace_id, name)`` keys, in one query; keys with
    no registration are absent from the answer."""
    wanted = set(keys)
    if not wanted:
        return {}
    query = select(providers)
    if len(wanted) <= BY_NAMES_IN_LIMIT:
        query = query.where(tuple_(P.namespace_id, P.name).in_(sorted(wanted)))
    found = {}
    for row in (await conn.execute(query)).mappings():
        key = (row["namespace_id"], row["name"])
        if key in wanted:
            found[key] = row
    return found


async def queues_naming(conn: AsyncConnection, namespace_id: str, name: str) -> builtins.list[str]:
    """Names of the namespace's queues (archived ones aside) that launch through provider
    ``name``: as their ``providerRef`` or their ``daemonTemplate.provider``."""
    mentioned = cast(Q.daemon_template, String).contains(f'"{name}"', autoescape=True)
    query = (
        select(Q.name, Q.provider_ref, Q.daemon_template)
        .where(Q.namespace_id == namespace_id, Q.state != "archived")
        .where(or_(Q.provider_ref == name, mentioned))
        .order_by(Q.name)
    )
    users = []
    for queue, ref, template in (await conn.execute(query)).all():
        named = template.get("provider") if isinstance(template, dict) else None
        if name in (ref, named):
            users.append(str(queue))
    return users
