"""A row that may not exist yet, made if missing, then locked and read: how a tally or a
bucket that several servers update is read for its update."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Row, Table, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection


async def locked_row(
    conn: AsyncConnection, table: Table, key: Mapping[str, Any], first: Mapping[str, Any]
) -> Row[Any]:
    """The row of ``table`` whose primary key is ``key``, inserted with ``first`` when it
    is missing (a racing insert of another transaction is not an error), then locked for
    the transaction (``FOR UPDATE``; SQLite's one writer already holds it) and read."""
    insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
    await conn.execute(insert(table).values(**key, **first).on_conflict_do_nothing())
    where = [table.c[name] == value for name, value in key.items()]
    return (await conn.execute(select(table).where(*where).with_for_update())).one()
