"""Writing rows the API cannot write yet (invocations arrive with the task-queue routes)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import insert

from lakeshore.domain.ids import new_id
from lakeshore.store.engine import Store
from lakeshore.store.tables import invocations


async def insert_invocation(
    store: Store, queue: dict[str, Any], *, state: str, now: datetime
) -> str:
    invocation_id = new_id("inv")
    async with store.write() as conn:
        await conn.execute(
            insert(invocations).values(
                {
                    "id": invocation_id,
                    "namespace_id": queue["namespaceId"],
                    "queue_id": queue["id"],
                    "queue_name": queue["name"],
                    "fn": "example:noop",
                    "args": [],
                    "kwargs": {},
                    "state": state,
                    "available_at": now,
                    "created_at": now,
                    # as every path that finishes an invocation stamps it
                    "finished_at": None if state in ("pending", "running") else now,
                }
            )
        )
    return invocation_id
