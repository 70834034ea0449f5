"""Streaming: a generator UDF's yielded items, appended by the worker that holds the lease
and followed by clients as they arrive.

A follower reads the items after the last one it saw; when there are none it waits for a
wake-up (an append or the invocation ending, in this process or, on PostgreSQL, on
another replica) or a short re-check, and it ends with the invocation's final state once
that state is reached and every item before it has been read. A server that begins to
stop (``stopping``) ends its streams there, without the final state: the client resumes
after the last item it got, from this server once it is back or from another replica.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from lakeshore.domain.invocations import FINAL_STATES
from lakeshore.errors import Conflict, InvalidInput, NotFound
from lakeshore.services.auth import Principal
from lakeshore.services.namespaces import Namespace
from lakeshore.services.taskqueue import invocations as inv_service
from lakeshore.services.taskqueue.invocations import stream_key, to_json
from lakeshore.services.taskqueue.notify import Notifier, wait_any
from lakeshore.store import invocations as inv_store
from lakeshore.store import leases as lease_store
from lakeshore.store import streams as stream_store
from lakeshore.store import wakeups
from lakeshore.store.engine import Store

MAX_ITEMS_PER_APPEND = 1000
MAX_SEQ = 2**31 - 1  # item numbers are INTEGERs
READ_BATCH = 500
RECHECK_S = 1.0  # the fallback when no wake-up arrives (e.g. a reaped lease)


@dataclass(frozen=True)
class Event:
    """One server-sent event: an ``item`` (with its number) or the ``end``."""

    kind: str
    data: Any
    seq: int | None = None


async def append(
    store: Store,
    notifier: Notifier,
    worker_id: str,
    invocation_id: str,
    first_seq: int,
    items: Sequence[Any],
    now: datetime,
) -> dict[str, Any]:
    """Store items numbered from ``first_seq``, only while ``worker_id`` holds the lease."""
    if len(items) > MAX_ITEMS_PER_APPEND:
        raise InvalidInput(
            f"at most {MAX_ITEMS_PER_APPEND} items per append, not {len(items)}", field="items"
        )
    async with store.write() as conn:
        if not await lease_store.holds(conn, invocation_id, worker_id):
            raise Conflict(
                f'this worker does not hold invocation "{invocation_id}" (lease lost, '
                "cancelled or finished); nothing was stored",
                field="invocation",
            )
        await stream_store.append(conn, invocation_id, first_seq, items, now)
        await wakeups.publish(conn, [stream_key(invocation_id)])
    notifier.notify([stream_key(invocation_id)])
    return {"next_seq": first_seq + len(items)}


async def require(
    store: Store, ns: Namespace, invocation_id: str, caller: Principal | None = None
) -> None:
    """NotFound (or Forbidden, by the queue's ``authPolicy.read``) before a stream starts,
    rather than a broken stream after."""
    async with store.read() as conn:
        row = await inv_store.get(conn, ns.id, invocation_id)
        if row is None:
            raise NotFound(f'invocation "{invocation_id}" not found', field="id")
        await inv_service.require_access(conn, caller, ns, row["queue_name"], "read")


async def follow(
    store: Store,
    notifier: Notifier,
    ns: Namespace,
    invocation_id: str,
    *,
    after_seq: int = -1,
    recheck_s: float = RECHECK_S,
    stopping: asyncio.Event | None = None,
) -> AsyncIterator[Event]:
    """Items numbered above ``after_seq`` as they arrive, then the final state; or, once
    ``stopping`` is set, nothing more (the items read so far have been given)."""
    last = after_seq
    with notifier.listen([stream_key(invocation_id)]) as woken:
        while True:
            woken.clear()
            async with store.read() as conn:
                row = await inv_store.get(conn, ns.id, invocation_id)
                if row is None:  # deleted with its namespace while followed
                    return
                items = await stream_store.read_after(conn, invocation_id, last, limit=READ_BATCH)
            for seq, item in items:
                last = seq
                yield Event("item", item, seq)
            if items:
                continue
            if row["state"] in FINAL_STATES:  # read before the items: none can follow it
                yield Event("end", to_json(row))
                return
            if stopping is not None and stopping.is_set():
                return
            await wait_any([woken] if stopping is None else [woken, stopping], recheck_s)
