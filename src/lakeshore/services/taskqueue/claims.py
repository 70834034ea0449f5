"""Claims: a worker's long-poll, served from its own queues first, then — when those are
empty and the worker is idle — from the pool siblings it may steal from.

Work-stealing is a poll-time decision; the controller is not involved. The rules:

* A *sibling* is a queue of the worker's namespace that shares an ``elasticity.pool``
  with one of the worker's own queues and dispatches (active or draining). "Own queues"
  are the worker's subscribed queues that dispatch, as for ordinary claims; a paused or
  archived own queue lends its pool nothing.
* The sibling's ``elasticity.match`` gates: every ``match.tags`` value must be among the
  worker's tags and every ``match.runners`` value among its runners. No match: anyone.
* Only an idle worker steals: it holds no running invocation, its own queues gave it
  nothing on this claim, and it has been idle at least ``steal_delay_s`` — the largest
  ``elasticity.steal_delay_s`` over its own queues (unset counts as 0). Idle since = its
  latest finished invocation, or its registration if that is later or it finished none
  (see :func:`lakeshore.store.workers.idle_since`).
* Stolen work is leased exactly like own work: same lease, the sibling's discipline, the
  sibling's ``deadline_cutoff_s`` applied first. Siblings are tried by name.

Time comes from the caller's clock only.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection

from lakeshore.domain import access
from lakeshore.errors import Gone, NotFound
from lakeshore.services.taskqueue.handoff import Waiter, Waiting
from lakeshore.services.taskqueue.invocations import to_json
from lakeshore.services.taskqueue.notify import Hangup, Notifier, wait_one
from lakeshore.store import claimable
from lakeshore.store import invocations as inv_store
from lakeshore.store import workers as worker_store
from lakeshore.store.engine import Store

MIN_PAUSE_S = 0.05  # never re-check sooner than this (a steal delay about to end)
RETIRING_RECHECK_S = 0.5  # a worker being retired learns of it (410) this soon


def worker_key(worker_id: str) -> str:
    """The notifier key a worker's waiting claim listens on for its own retirement."""
    return f"worker:{worker_id}"


class ClaimingWorker(Protocol):
    """What a claim needs to know of the worker (``services.workers.WorkerRef``)."""

    @property
    def id(self) -> str: ...

    @property
    def namespace_id(self) -> str: ...

    @property
    def max_invocations(self) -> int: ...

    @property
    def holds(self) -> int: ...

    @property
    def reach(self) -> Reach: ...

    @property
    def caller(self) -> access.Caller | None: ...


@dataclass(frozen=True)
class Reach:
    """The worker's tags and runners: what a sibling's ``match`` is checked against."""

    tags: frozenset[str] = frozenset()
    runners: frozenset[str] = frozenset()

    @classmethod
    def of(cls, row: RowMapping | None) -> Reach:
        if row is None:
            return cls()
        return cls(tags=frozenset(row["tags"] or ()), runners=frozenset(row["runners"] or ()))

    def admits(self, queue: RowMapping) -> bool:
        """Whether the queue's ``elasticity.match`` lets this worker steal from it."""
        match = (queue["elasticity"] or {}).get("match") or {}
        return (
            set(match.get("tags") or ()) <= self.tags
            and set(match.get("runners") or ()) <= self.runners
        )


@dataclass(frozen=True)
class Attempt:
    """One look for work: what was leased, and — when only the steal delay stood in the
    way — how many seconds until it has passed."""

    claimed: list[dict[str, Any]] = field(default_factory=list)
    steal_in_s: float | None = None
    retiring: bool = False  # the controller is stopping this worker: stop waiting
    # (asked for) when the earliest pending invocation of the queues it looked in that
    # was not yet claimable falls due: a retry waiting out its backoff
    due_at: datetime | None = None


def steal_delay_s(own: Iterable[RowMapping]) -> float:
    """The largest ``elasticity.steal_delay_s`` over the worker's own queues (unset: 0)."""
    delays = [((q["elasticity"] or {}).get("steal_delay_s") or 0) for q in own]
    return float(max(delays, default=0))


async def _lease(
    conn: AsyncConnection,
    queues: Sequence[RowMapping],
    worker_id: str,
    free: int,
    now: datetime,
    lease_s: float,
    expired: dict[str, int] | None = None,
) -> list[dict[str, Any]]:
    """Lease up to ``free`` invocations from ``queues`` in turn, each by its discipline;
    work past a queue's ``deadline_cutoff_s`` is expired first (counted in ``expired``,
    queue id → how many)."""
    claimed: list[dict[str, Any]] = []
    for queue in queues:
        if free - len(claimed) <= 0:
            break
        cutoff = (queue["admission"] or {}).get("deadline_cutoff_s")
        if cutoff is not None:
            late = await inv_store.expire_overdue(conn, queue["id"], cutoff, now)
            if late and expired is not None:
                expired[queue["id"]] = expired.get(queue["id"], 0) + late
        rows = await inv_store.claim(
            conn,
            queue_id=queue["id"],
            kind=queue["kind"],
            worker_id=worker_id,
            limit=free - len(claimed),
            now=now,
            lease_s=lease_s,
            temperature=(queue["kind_params"] or {}).get("temperature"),
            limits=claimable.Limits.of(queue["admission"]),
            keyed=bool(queue.get("keyed")),
        )
        claimed.extend(to_json(row) for row in rows)
    return claimed


async def _steal_wait_s(
    conn: AsyncConnection, worker_id: str, delay_s: float, now: datetime
) -> float:
    """Seconds the (idle) worker must still wait before it may steal; 0 when it may."""
    if delay_s <= 0:
        return 0.0
    since = await worker_store.idle_since(conn, worker_id)
    if since is None:
        return delay_s  # the worker is gone
    return max(0.0, delay_s - (now - since).total_seconds())


_UNTOUCHED: Any = object()


async def claim_once(
    store: Store,
    worker: ClaimingWorker,
    reach: Reach,
    limit: int,
    now: datetime,
    lease_s: float,
    expired: dict[str, int] | None = None,
) -> Attempt:
    """Lease what the worker may take now, in a transaction of its own."""
    async with store.write() as conn:
        return await claim_in(conn, worker, reach, limit, now, lease_s, expired=expired, due=True)


async def claim_in(
    conn: AsyncConnection,
    worker: ClaimingWorker,
    reach: Reach,
    limit: int,
    now: datetime,
    lease_s: float,
    *,
    seen: Any = _UNTOUCHED,
    expired: dict[str, int] | None = None,
    due: bool = False,
) -> Attempt:
    """Lease what the worker may take now, in the caller's write transaction: its own
    queues first; stolen work only when those gave nothing and the worker is idle (see
    the module's rules). 404/410 for a worker dropped or retired meanwhile. ``seen`` is
    what :func:`worker_store.touch` answered, when the caller touched the worker first
    (its row is locked before any invocation's, as a heartbeat locks them). ``expired``
    counts the work expired on the way (queue id → how many). ``due``: when it leases
    nothing, say when the next invocation it could take falls due (``due_at``)."""
    view: tuple[int, list[Any]] | None = None
    if seen is _UNTOUCHED:
        seen, running, rows = await worker_store.touch_and_view(
            conn, worker.id, worker.namespace_id, now
        )
        view = (running, rows)
    if seen is None:  # retired (or dropped) while this claim waited
        if await worker_store.is_retired(conn, worker.id):
            raise Gone(f'worker "{worker.id}" was retired', field="id")
        raise NotFound(f'worker "{worker.id}" not found; say hello first', field="id")
    if seen:
        # the controller is stopping it: nothing more, and a quick re-check so the
        # waiting claim answers 410 as soon as the retirement is done
        return Attempt(retiring=True)
    if view is None:
        view = await worker_store.claim_view(conn, worker.id, worker.namespace_id)
    running, claimable = view
    free = min(limit, worker.holds - running)
    if free <= 0:
        return Attempt()
    queues = _claimable_by(worker.caller, claimable)
    subscribed = [q for q in queues if q["own"]]
    own = [q for q in subscribed if q["state"] != "paused"]
    claimed = await _lease(conn, own, worker.id, free, now, lease_s, expired)
    if claimed:
        return Attempt(claimed)
    # only an idle worker steals
    siblings = [] if running else [q for q in queues if not q["own"] and reach.admits(q)]
    wait_s = await _steal_wait_s(conn, worker.id, steal_delay_s(subscribed), now) if siblings else 0
    if wait_s > 0:
        due_at = await _due_at(conn, own, now) if due else None
        return Attempt(steal_in_s=wait_s, due_at=due_at)
    stolen = await _lease(conn, siblings, worker.id, free, now, lease_s, expired)
    if stolen or not due:
        return Attempt(stolen)
    return Attempt(due_at=await _due_at(conn, [*own, *siblings], now))


async def _due_at(
    conn: AsyncConnection, queues: Sequence[RowMapping], now: datetime
) -> datetime | None:
    return await inv_store.next_due_at(conn, [q["id"] for q in queues], now)


def _claimable_by(caller: access.Caller | None, queues: list[RowMapping]) -> list[RowMapping]:
    """The queues whose ``authPolicy.claim`` lets ``caller`` claim (a policy written after
    the worker's hello included)."""
    if caller is None or caller.is_admin:
        return queues
    return [
        q
        for q in queues
        if q["auth_policy"] is None
        or access.refusal(q["auth_policy"], "claim", caller, q["name"]) is None
    ]


def pause_s(attempt: Attempt, now: datetime, recheck_s: float) -> float:
    """How long a claim that found nothing (``attempt``, at ``now``) waits before it
    looks again, unless woken: the re-check, or less when the worker's steal delay or a
    retry's backoff ends sooner; a worker being retired looks again soon."""
    if attempt.retiring:
        return RETIRING_RECHECK_S
    pause = recheck_s
    if attempt.steal_in_s is not None:
        pause = min(pause, max(attempt.steal_in_s, MIN_PAUSE_S))
    if attempt.due_at is not None:
        pause = min(pause, max((attempt.due_at - now).total_seconds(), MIN_PAUSE_S))
    return pause


async def long_poll(
    store: Store,
    notifier: Notifier,
    worker: ClaimingWorker,
    *,
    wait_s: float,
    limit: int,
    clock: Callable[[], datetime],
    lease_s: float,
    recheck_s: float,
    gone: Hangup | None = None,
    tried: bool = False,
    expired: dict[str, int] | None = None,
    waiting: Waiting | None = None,
) -> list[dict[str, Any]]:
    """Return as soon as anything is claimable (up to ``limit``), or an empty list after
    ``wait_s``. Submits to the worker's own queues and to the siblings it may steal from
    wake it; so does the end of its steal delay, when that is all that kept it waiting.
    ``tried``: the caller has just looked, and found nothing (see :func:`claim_in`).
    ``waiting``: while it waits, a submit to one of its own active queues may hand it
    the invocation, leased already (:mod:`.handoff`)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    reach = worker.reach
    if not tried and (gone is None or not gone.is_set()):
        # a worker with a backlog is served at once, without setting up a wait
        attempt = await claim_once(store, worker, reach, limit, clock(), lease_s, expired)
        if attempt.claimed or wait_s <= 0 or limit == 0:
            return attempt.claimed
    async with store.read() as conn:
        queues = await worker_store.claimable_queues(conn, worker.id, worker.namespace_id)
    del conn  # back in the pool: not kept alive by the wait below
    watched = [q["id"] for q in queues if q["own"] or reach.admits(q)]
    watched.append(worker_key(worker.id))  # the controller retiring it
    handing = [q["id"] for q in queues if q["own"] and q["state"] == "active"]
    # one event wakes the wait: a notify, a hand-off, the caller gone (``gone.bell``)
    with notifier.listen(watched, None if gone is None else gone.bell) as woken:
        while True:
            woken.clear()
            if gone is not None and gone.is_set():
                return []  # the caller hung up: lease nothing it cannot receive
            now = clock()
            attempt = await claim_once(store, worker, reach, limit, now, lease_s, expired)
            remaining = deadline - loop.time()
            if attempt.claimed or remaining <= 0 or limit == 0:
                return attempt.claimed
            pause = pause_s(attempt, now, recheck_s + random.uniform(0, 0.5))
            if waiting is None or not handing or limit == 0:
                await wait_one(woken, min(pause, remaining))
                continue
            me = Waiter(worker.id, worker.holds, worker.caller, lease_s, gone, woken)
            with waiting.wait(me, handing):
                await wait_one(woken, min(pause, remaining))
            handed = await me.received()
            if handed:
                return handed
