"""A PostgreSQL store's server side, seen from a connection of the test's own."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg

from lakeshore.store.engine import Store


def admin_connection(store: Store) -> psycopg.Connection[tuple[Any, ...]]:
    """An autocommit connection to the store's database, outside the store."""
    url = store.engine.url.set(drivername="postgresql")
    return psycopg.connect(url.render_as_string(hide_password=False), autocommit=True)


async def until_active(
    admin: psycopg.Connection[tuple[Any, ...]],
    where: str,
    parameters: tuple[Any, ...] = (),
    *,
    active: bool = True,
    tries: int = 500,
) -> bool:
    """Whether a backend matching ``where`` (on ``pg_stat_activity``) came to run a
    statement (``active``), or none did any more, within ``tries`` looks 10 ms apart."""
    query = f"SELECT 1 FROM pg_stat_activity WHERE ({where}) AND state = 'active'"
    for _ in range(tries):
        if (admin.execute(query, parameters).fetchone() is not None) == active:
            return True
        await asyncio.sleep(0.01)
    return False
