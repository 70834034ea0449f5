"""Invocation rows: batch submit with idempotency keys, batch claims, leases, the reaper.

Claims are one ``SELECT … LIMIT n`` and one ``UPDATE … RETURNING`` per queue, whatever
``n`` is. On PostgreSQL the select takes ``FOR UPDATE SKIP LOCKED``, so servers sharing a
database never hand one invocation to two workers; on SQLite the write transaction
(``BEGIN IMMEDIATE``) already serializes claimers.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    RowMapping,
    and_,
    bindparam,
    case,
    func,
    literal,
    or_,
    select,
    tuple_,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from lakeshore.domain import disciplines
from lakeshore.domain.invocations import Report, after_failure, retry_backoff_s
from lakeshore.store.tables import invocations, queues

C = invocations.c

_ORDER: dict[str, tuple[ColumnElement[Any], ...]] = {
    "fifo": (C.created_at, C.id),
    "filo": (C.created_at.desc(), C.id.desc()),
    "priority": (C.priority.desc(), C.created_at, C.id),
    "boltzmann": (C.priority.desc(), C.created_at, C.id),
}
_RNG = random.Random()


def _is_pg(conn: AsyncConnection) -> bool:
    return conn.dialect.name == "postgresql"


async def insert_many(conn: AsyncConnection, rows: Sequence[dict[str, Any]]) -> list[RowMapping]:
    """Insert ``rows``; a row whose (queue, key) exists is not inserted. Returns, for each
    row in order, the stored row: the new one, or the one that already held its key."""
    if not rows:
        return []
    dialect_insert = postgresql.insert if _is_pg(conn) else sqlite.insert
    stmt = dialect_insert(invocations).on_conflict_do_nothing(index_elements=["queue_id", "key"])
    await conn.execute(stmt, list(rows))
    ids = [row["id"] for row in rows]
    keyed = {(row["queue_id"], row["key"]) for row in rows if row["key"] is not None}
    where: ColumnElement[bool] = C.id.in_(ids)
    if keyed:
        where = or_(where, tuple_(C.queue_id, C.key).in_(sorted(keyed)))
    stored = (await conn.execute(select(invocations).where(where))).mappings().all()
    by_id = {row["id"]: row for row in stored}
    by_key = {(row["queue_id"], row["key"]): row for row in stored if row["key"] is not None}
    return [
        by_key[(row["queue_id"], row["key"])] if row["key"] is not None else by_id[row["id"]]
        for row in rows
    ]


async def get(conn: AsyncConnection, namespace_id: str, invocation_id: str) -> RowMapping | None:
    query = select(invocations).where(C.namespace_id == namespace_id, C.id == invocation_id)
    return (await conn.execute(query)).mappings().first()


async def existing_keys(conn: AsyncConnection, queue_id: str, keys: set[str]) -> set[str]:
    query = select(C.key).where(C.queue_id == queue_id, C.key.in_(sorted(keys)))
    return {str(key) for key in (await conn.execute(query)).scalars()}


async def list_for_queue(
    conn: AsyncConnection,
    queue_id: str,
    *,
    states: Sequence[str] = (),
    limit: int = 100,
    before: tuple[datetime, str] | None = None,
) -> list[RowMapping]:
    """Newest first; ``before`` (created_at, id) continues after the last row of a page."""
    query = select(invocations).where(C.queue_id == queue_id)
    if states:
        query = query.where(C.state.in_(states))
    if before is not None:
        created, last_id = before
        query = query.where(
            or_(C.created_at < created, and_(C.created_at == created, C.id < last_id))
        )
    query = query.order_by(C.created_at.desc(), C.id.desc()).limit(limit)
    return list((await conn.execute(query)).mappings())


async def cancel(conn: AsyncConnection, invocation_id: str, now: datetime) -> RowMapping | None:
    """Cancel if not final yet; returns the row as it stands afterwards."""
    await conn.execute(
        update(invocations)
        .where(C.id == invocation_id, C.state.in_(("pending", "running")))
        .values(state="cancelled", finished_at=now, lease_expires_at=None)
    )
    return (await conn.execute(select(invocations).where(C.id == invocation_id))).mappings().first()


async def claim(
    conn: AsyncConnection,
    *,
    queue_id: str,
    kind: str,
    worker_id: str,
    limit: int,
    now: datetime,
    lease_s: float,
    temperature: float | None = None,
) -> list[RowMapping]:
    """Lease up to ``limit`` claimable invocations of one queue to ``worker_id``.

    ``boltzmann`` queues sample among the top candidates by priority (see
    :mod:`lakeshore.domain.disciplines`); the others take them in order.
    """
    if limit <= 0:
        return []
    sampled = kind == "boltzmann"
    query = (
        select(C.id, C.priority)
        .where(C.queue_id == queue_id, C.state == "pending", C.available_at <= now)
        .order_by(*_ORDER.get(kind, _ORDER["fifo"]))
        .limit(disciplines.candidate_count(limit) if sampled else limit)
    )
    if _is_pg(conn):
        query = query.with_for_update(skip_locked=True)
    rows = [(row[0], float(row[1])) for row in (await conn.execute(query)).all()]
    if sampled:
        ids = disciplines.boltzmann_pick(rows, limit, temperature, _RNG)
    else:
        ids = [invocation_id for invocation_id, _ in rows]
    if not ids:
        return []
    claimed = await conn.execute(
        update(invocations)
        .where(C.id.in_(ids), C.state == "pending")
        .values(
            state="running",
            worker_id=worker_id,
            lease_expires_at=now + timedelta(seconds=lease_s),
            started_at=now,
            attempts=C.attempts + 1,
        )
        .returning(*invocations.c)
    )
    order = {invocation_id: i for i, invocation_id in enumerate(ids)}
    return sorted(claimed.mappings().all(), key=lambda row: order[row["id"]])


def _expired(cutoff_s: float, now: datetime) -> dict[str, Any]:
    error = {"type": "DeadlineExpired", "message": f"not started within {cutoff_s:g} s"}
    return {"state": "expired", "finished_at": now, "error": error}


# ``deadline_cutoff_s`` counts from the submit and ends with the first dispatch: work that
# was claimed once (a retry waiting out its backoff, work handed back) keeps its place
_NEVER_STARTED = (C.state == "pending", C.started_at.is_(None))


async def expire_overdue(
    conn: AsyncConnection, queue_id: str, cutoff_s: float, now: datetime
) -> int:
    """``deadline_cutoff_s`` of one queue: pending work never started and submitted longer
    ago than that is expired."""
    expired = await conn.execute(
        update(invocations)
        .where(
            C.queue_id == queue_id,
            *_NEVER_STARTED,
            C.created_at < now - timedelta(seconds=cutoff_s),
        )
        .values(_expired(cutoff_s, now))
    )
    return int(expired.rowcount)


async def expire_all_overdue(conn: AsyncConnection, now: datetime) -> list[str]:
    """``deadline_cutoff_s`` of every queue that sets one (paused ones too): pending work
    never started and submitted longer ago than its queue's cutoff is expired, whether or
    not a claim looks at that queue. One read of the cutoffs and one UPDATE for every
    queue (grouped by cutoff, not a statement per queue). Returns the ids expired."""
    cutoff = queues.c.admission["deadline_cutoff_s"].as_float()
    rows = (await conn.execute(select(queues.c.id, cutoff).where(cutoff.is_not(None)))).all()
    by_cutoff: dict[float, list[str]] = {}
    for queue_id, cutoff_s in rows:
        by_cutoff.setdefault(float(cutoff_s), []).append(str(queue_id))
    if not by_cutoff:
        return []
    late = [
        and_(C.queue_id.in_(ids), C.created_at < now - timedelta(seconds=cutoff_s))
        for cutoff_s, ids in by_cutoff.items()
    ]
    # each error names its queue's own cutoff
    error = case(
        *(
            (C.queue_id.in_(ids), literal(_expired(cutoff_s, now)["error"], C.error.type))
            for cutoff_s, ids in by_cutoff.items()
        )
    )
    done = await conn.execute(
        update(invocations)
        .where(*_NEVER_STARTED, or_(*late))
        .values(state="expired", finished_at=now, error=error)
        .returning(C.id)
    )
    return sorted(str(i) for i in done.scalars())


async def next_available_at(conn: AsyncConnection, queue_ids: Sequence[str]) -> datetime | None:
    """When the earliest pending invocation of these queues is (or was) claimable; None
    when they hold no pending work."""
    if not queue_ids:
        return None
    query = select(func.min(C.available_at)).where(
        C.queue_id.in_(list(queue_ids)), C.state == "pending"
    )
    value: datetime | None = (await conn.execute(query)).scalar_one()
    return value


def _held(invocation_id: str, worker_id: str) -> ColumnElement[bool]:
    return and_(C.id == invocation_id, C.state == "running", C.worker_id == worker_id)


async def holds(conn: AsyncConnection, invocation_id: str, worker_id: str) -> bool:
    """Whether the worker holds the invocation's lease right now."""
    query = select(C.id).where(_held(invocation_id, worker_id))
    if _is_pg(conn):
        query = query.with_for_update()
    return (await conn.execute(query)).first() is not None


async def complete(
    conn: AsyncConnection, invocation_id: str, worker_id: str, result: Any, now: datetime
) -> RowMapping | None:
    """Succeed an invocation the worker still holds: the row as it is now, or None
    (nothing changed) when the worker does not hold it."""
    done = await conn.execute(
        update(invocations)
        .where(_held(invocation_id, worker_id))
        .values(
            state="succeeded", result=result, error=None, finished_at=now, lease_expires_at=None
        )
        .returning(*invocations.c)
    )
    return done.mappings().first()


async def fail(
    conn: AsyncConnection,
    invocation_id: str,
    worker_id: str,
    error: dict[str, Any],
    *,
    retry: bool,
    now: datetime,
) -> RowMapping | None:
    """Record a failed attempt of an invocation the worker holds: back to pending after a
    backoff, or failed for good. None (nothing changed) if the worker no longer holds it."""
    query = select(C.attempts, C.max_attempts).where(_held(invocation_id, worker_id))
    if _is_pg(conn):
        query = query.with_for_update()
    row = (await conn.execute(query)).first()
    if row is None:
        return None
    attempts, max_attempts = row
    state = after_failure(attempts, max_attempts, retry=retry)
    values: dict[str, Any] = {"state": state, "error": error, "lease_expires_at": None}
    if state == "pending":
        values.update(
            worker_id=None, available_at=now + timedelta(seconds=retry_backoff_s(attempts))
        )
    else:
        values["finished_at"] = now
    stmt = update(invocations).where(_held(invocation_id, worker_id)).values(values)
    return (await conn.execute(stmt.returning(*invocations.c))).mappings().one()


async def report(
    conn: AsyncConnection, worker_id: str, reports: Sequence[Report], now: datetime
) -> dict[str, str]:
    """Record many outcomes at once, each only if the worker still holds that invocation.
    Returns each recorded invocation's new state (``succeeded``, ``pending`` to run again
    after its backoff, or ``failed``); the ids missing from it were not held. A select and
    at most three batched updates, whatever the number of reports."""
    if not reports:
        return {}
    query = select(C.id, C.attempts, C.max_attempts).where(
        C.id.in_([r.invocation_id for r in reports]),
        C.worker_id == worker_id,
        C.state == "running",
    )
    if _is_pg(conn):
        query = query.with_for_update()
    held = {row[0]: (row[1], row[2]) for row in (await conn.execute(query)).all()}
    states: dict[str, str] = {}
    done: list[dict[str, Any]] = []
    again: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    for r in reports:
        if r.invocation_id not in held or r.invocation_id in states:
            continue
        if r.error is None:
            states[r.invocation_id] = "succeeded"
            done.append({"b_id": r.invocation_id, "b_result": r.result})
            continue
        attempts, max_attempts = held[r.invocation_id]
        state = after_failure(attempts, max_attempts, retry=r.retry)
        states[r.invocation_id] = state
        if state == "pending":
            delay = timedelta(seconds=retry_backoff_s(attempts))
            again.append({"b_id": r.invocation_id, "b_error": r.error, "b_at": now + delay})
        else:
            failed.append({"b_id": r.invocation_id, "b_error": r.error})
    mine = update(invocations).where(
        C.id == bindparam("b_id"), C.worker_id == worker_id, C.state == "running"
    )
    error = bindparam("b_error", type_=C.error.type)
    if done:
        result = bindparam("b_result", type_=C.result.type)
        values = {"state": "succeeded", "result": result, "error": None, "finished_at": now}
        await conn.execute(mine.values({**values, "lease_expires_at": None}), done)
    if again:
        at = bindparam("b_at", type_=C.available_at.type)
        values = {"state": "pending", "error": error, "available_at": at, "worker_id": None}
        await conn.execute(mine.values({**values, "lease_expires_at": None}), again)
    if failed:
        values = {"state": "failed", "error": error, "finished_at": now}
        await conn.execute(mine.values({**values, "lease_expires_at": None}), failed)
    return states


async def extend_leases(
    conn: AsyncConnection,
    worker_id: str,
    now: datetime,
    lease_s: float,
    *,
    running: Collection[str] | None = None,
    claimed_since: datetime | None = None,
) -> list[str]:
    """Extend the leases the worker holds; returns the ids extended.

    With ``running`` (what the daemon says it runs), only those, and the ones claimed at
    or after ``claimed_since`` (their claim's answer may still be on its way), are
    extended; see :func:`hand_back` for the rest."""
    held: list[ColumnElement[bool]] = [C.worker_id == worker_id, C.state == "running"]
    if running is not None:
        listed = C.id.in_(list(running))
        recent = C.started_at >= claimed_since if claimed_since else None
        held.append(listed if recent is None else or_(listed, recent))
    done = await conn.execute(
        update(invocations)
        .where(*held)
        .values(lease_expires_at=now + timedelta(seconds=lease_s))
        .returning(C.id)
    )
    return sorted(done.scalars())


async def reap_expired(
    conn: AsyncConnection, now: datetime, *, limit: int = 1000
) -> dict[str, int]:
    """Return expired leases to pending (after a backoff) or fail them when attempts are spent."""
    query = (
        select(C.id, C.attempts, C.max_attempts)
        .where(C.state == "running", C.lease_expires_at < now)
        .limit(limit)
    )
    if _is_pg(conn):
        query = query.with_for_update(skip_locked=True)
    rows = (await conn.execute(query)).all()
    # one UPDATE per outcome: failed, or back to pending after the backoff of its attempt
    groups: dict[int | None, list[str]] = {}
    for invocation_id, attempts, max_attempts in rows:
        retried = after_failure(attempts, max_attempts, retry=True) == "pending"
        groups.setdefault(attempts if retried else None, []).append(invocation_id)
    counts = {"retried": 0, "failed": 0}
    error = {"type": "LeaseExpired", "message": "the worker stopped renewing its lease"}
    for attempts, ids in groups.items():
        values: dict[str, Any] = {"lease_expires_at": None, "error": error}
        if attempts is None:
            values.update(state="failed", finished_at=now)
            counts["failed"] += len(ids)
        else:
            delay = timedelta(seconds=retry_backoff_s(attempts))
            values.update(state="pending", worker_id=None, available_at=now + delay)
            counts["retried"] += len(ids)
        stmt = update(invocations).where(C.id.in_(ids), C.state == "running")
        await conn.execute(stmt.values(values))
    return counts


async def hand_back(
    conn: AsyncConnection,
    worker_id: str,
    now: datetime,
    *,
    running: Collection[str] = (),
    claimed_before: datetime | None = None,
) -> list[str]:
    """Return the worker's running invocations to pending, claimable now, their attempt
    not counted (the worker stopped, or never ran them; the function did not fail). One
    queue id per invocation handed back.

    A worker still alive keeps what it says it is ``running`` and what it claimed at or
    after ``claimed_before``; the rest it holds without running: a claim whose answer
    never reached it (the server died as it answered, the connection dropped) or a result
    it could not deliver."""
    held: list[ColumnElement[bool]] = [C.worker_id == worker_id, C.state == "running"]
    if running:
        held.append(C.id.not_in(list(running)))
    if claimed_before is not None:
        held.append(C.started_at < claimed_before)
    done = await conn.execute(
        update(invocations)
        .where(*held)
        .values(
            state="pending",
            worker_id=None,
            lease_expires_at=None,
            available_at=now,
            attempts=C.attempts - 1,
        )
        .returning(C.queue_id)
    )
    return [str(queue_id) for queue_id in done.scalars()]


async def running_count(conn: AsyncConnection, worker_id: str) -> int:
    query = select(func.count()).where(C.worker_id == worker_id, C.state == "running")
    return int((await conn.execute(query)).scalar_one())
