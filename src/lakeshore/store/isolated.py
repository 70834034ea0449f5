"""Sweeps over many rows that one bad row cannot stop: each group of rows is written in a
savepoint of its own, and a group that fails is rolled back, logged with its ids, and
skipped, while the rest of the sweep commits."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection

log = logging.getLogger("lakeshore.store")

T = TypeVar("T")

_SHOWN = 20  # ids named in one log line


async def isolated(
    conn: AsyncConnection, what: str, ids: Sequence[str], work: Callable[[], Awaitable[T]]
) -> T | None:
    """``work()`` in a savepoint; None (and a warning naming ``ids``) when it failed."""
    try:
        async with conn.begin_nested():
            return await work()
    except (SQLAlchemyError, ArithmeticError, ValueError) as exc:
        shown = ", ".join(ids[:_SHOWN]) + (" …" if len(ids) > _SHOWN else "")
        log.warning("%s skipped for %s: %s", what, shown, exc, extra={"ids": list(ids)})
        return None
