"""What a worker holds: its leases and the outcomes it reports.

Complete and fail act only on a row the worker still holds (``running``, leased to it), so
an outcome from a worker that lost its lease changes nothing. Heartbeats extend leases,
record which of them have begun (``begun_attempt``), and hand back what a live worker
holds without running it; the reaper returns expired leases to the queue, or fails them
once their attempts are spent. Each is one statement per outcome group, not per row.

A claim counts an attempt. A lease that ends without its attempt having begun (work a
daemon prefetched, the daemon gone) hands the attempt back: only what began is charged,
whether a dead daemon's sentinel says what it had started (:func:`charge` and
:func:`hand_back`) or only the lease's expiry tells (:func:`reap_expired`).

A row read to be changed is locked as it is read (``FOR UPDATE``). SQLAlchemy writes
nothing for that on SQLite, whose write transaction (``BEGIN IMMEDIATE``) already keeps
every other writer out, so the same statement serves both stores.
"""

from __future__ import annotations

import json
import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from sqlalchemy import (
    ARRAY,
    JSON,
    ColumnElement,
    RowMapping,
    Text,
    Update,
    and_,
    bindparam,
    case,
    cast,
    func,
    null,
    or_,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from lakeshore.domain.invocations import Report, after_failure
from lakeshore.domain.retry import RetryPolicy, policy_of
from lakeshore.store.isolated import isolated
from lakeshore.store.tables import invocations, workers

C = invocations.c
LEASE_EXPIRED = {"type": "LeaseExpired", "message": "the worker stopped renewing its lease"}
_JITTER = random.Random()  # draws a retry's wait below its bound (full jitter)


def _is_pg(conn: AsyncConnection) -> bool:
    return conn.dialect.name == "postgresql"


def _held(invocation_id: str, worker_id: str) -> ColumnElement[bool]:
    return and_(C.id == invocation_id, C.state == "running", C.worker_id == worker_id)


async def holds(conn: AsyncConnection, invocation_id: str, worker_id: str) -> bool:
    """Whether the worker holds the invocation's lease right now."""
    query = select(C.id).where(_held(invocation_id, worker_id)).with_for_update()
    return (await conn.execute(query)).first() is not None


async def complete(
    conn: AsyncConnection, invocation_id: str, worker_id: str, result: Any, now: datetime
) -> RowMapping | None:
    """Succeed an invocation the worker still holds: the row as it is now, or None
    (nothing changed) when the worker does not hold it. A report of one (:func:`report`:
    the one way an outcome is recorded)."""
    return await _reported(conn, worker_id, Report(invocation_id, result=result), now)


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
    backoff, or failed for good. None (nothing changed) if the worker no longer holds it.
    A report of one (:func:`report`)."""
    return await _reported(conn, worker_id, Report(invocation_id, error=error, retry=retry), now)


async def _reported(
    conn: AsyncConnection, worker_id: str, outcome: Report, now: datetime
) -> RowMapping | None:
    if outcome.invocation_id not in await report(conn, worker_id, [outcome], now):
        return None
    row = await conn.execute(select(invocations).where(C.id == outcome.invocation_id))
    return row.mappings().one()


async def report(
    conn: AsyncConnection,
    worker_id: str,
    reports: Sequence[Report],
    now: datetime,
    *,
    held_rows: dict[str, tuple[str, datetime | None]] | None = None,
) -> dict[str, str]:
    """Record many outcomes at once, each only if the worker still holds that invocation.
    Returns each recorded invocation's new state (``succeeded``, ``pending`` to run again
    after its backoff, or ``failed``); the ids missing from it were not held. A select and
    at most three batched updates, whatever the number of reports. ``held_rows``, when
    given, is filled with each held invocation's queue id and start (for the metrics)."""
    if not reports:
        return {}
    states: dict[str, str] = {}
    if _is_pg(conn):  # the successes, a busy daemon's usual batch, in one statement
        reports = await _succeed_many(conn, worker_id, reports, now, states, held_rows)
        if not reports:
            return states
    query = (
        select(C.id, C.attempts, C.max_attempts, C.queue_id, C.started_at, C.retry)
        .where(
            C.id.in_([r.invocation_id for r in reports]),
            C.worker_id == worker_id,
            C.state == "running",
        )
        .with_for_update()
    )
    rows = (await conn.execute(query)).all()
    held = {row[0]: (row[1], policy_of(row[5], row[2])) for row in rows}
    _note(held_rows, rows)
    done, again, failed = _grouped(reports, held, now, states)
    if done:
        mark = {"b_worker_id": worker_id, "b_now": now}
        await conn.execute(_SUCCEED_ONE, [{**params, **mark} for params in done])
    mine = update(invocations).where(
        C.id == bindparam("b_id"), C.worker_id == worker_id, C.state == "running"
    )
    error = bindparam("b_error", type_=C.error.type)
    values: dict[str, Any]
    if again:
        at = bindparam("b_at", type_=C.available_at.type)
        values = {"state": "pending", "error": error, "available_at": at, "worker_id": None}
        await conn.execute(mine.values({**values, "lease_expires_at": None}), again)
    if failed:
        values = {"state": "failed", "error": error, "finished_at": now}
        await conn.execute(mine.values({**values, "lease_expires_at": None}), failed)
    return states


def _succeeded(invocation_id: ColumnElement[Any], result: ColumnElement[Any]) -> Update:
    """The one UPDATE that records a success: the row ``invocation_id`` while worker
    ``b_worker_id`` holds it, succeeded with ``result``, finished at ``b_now``, its
    error and lease cleared. Two statements are made of it, which differ only in where
    each row's id and result come from."""
    return (
        update(invocations)
        .where(C.id == invocation_id, C.worker_id == bindparam("b_worker_id"), C.state == "running")
        .values(
            state="succeeded",
            result=result,
            error=null(),
            finished_at=bindparam("b_now", type_=C.finished_at.type),
            lease_expires_at=null(),
        )
    )


# PostgreSQL: every success of a report in one statement, the pairs sent as two arrays
# (the results as the column's text of json, kept as written)
_BATCH = (
    func.unnest(
        cast(bindparam("b_ids"), ARRAY(Text())), cast(bindparam("b_results"), ARRAY(Text()))
    )
    .table_valued("id", "result")
    .render_derived(name="b")
)
_SUCCEED_MANY = _succeeded(_BATCH.c.id, cast(_BATCH.c.result, JSON())).returning(
    C.id, C.queue_id, C.started_at
)
# SQLite: one success a row of an executemany, its result bound as the column's type binds
# it (numbers' text kept as written: store/types.py)
_SUCCEED_ONE = _succeeded(bindparam("b_id"), bindparam("b_result", type_=C.result.type))


async def _succeed_many(
    conn: AsyncConnection,
    worker_id: str,
    reports: Sequence[Report],
    now: datetime,
    states: dict[str, str],
    held_rows: dict[str, tuple[str, datetime | None]] | None,
) -> list[Report]:
    """PostgreSQL: succeed, in one statement, each reported success the worker still
    holds (into ``states`` and ``held_rows``); the failures are returned, to be recorded
    one group at a time. Results are encoded as the column's type encodes them (text of
    ``json``, kept as written)."""
    results = {r.invocation_id: r.result for r in reports if r.error is None}
    if results:
        params = {
            "b_ids": list(results),
            "b_results": [json.dumps(value) for value in results.values()],
            "b_now": now,
            "b_worker_id": worker_id,
        }
        succeeded = (await conn.execute(_SUCCEED_MANY, params)).all()
        _note(held_rows, [(i, None, None, queue_id, at) for i, queue_id, at in succeeded])
        states.update((row[0], "succeeded") for row in succeeded)
    return [r for r in reports if r.error is not None and r.invocation_id not in results]


def _grouped(
    reports: Sequence[Report],
    held: dict[str, tuple[int, RetryPolicy]],
    now: datetime,
    states: dict[str, str],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """The held reports' parameters by outcome: succeeded, pending again (after their
    backoff), failed for good; each one's new state goes into ``states``."""
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
        attempts, policy = held[r.invocation_id]
        state = after_failure(attempts, policy, retry=r.retry, error=r.error)
        states[r.invocation_id] = state
        if state == "pending":
            at = now + timedelta(seconds=policy.wait_s(attempts, _JITTER.random()))
            again.append({"b_id": r.invocation_id, "b_error": r.error, "b_at": at})
        else:
            failed.append({"b_id": r.invocation_id, "b_error": r.error})
    return done, again, failed


def _note(held_rows: dict[str, tuple[str, datetime | None]] | None, rows: Sequence[Any]) -> None:
    if held_rows is not None:
        held_rows.update({row[0]: (row[3], row[4]) for row in rows})


async def extend_leases(
    conn: AsyncConnection,
    worker_id: str,
    now: datetime,
    lease_s: float,
    *,
    running: Collection[str] | None = None,
    prefetched: Collection[str] | None = None,
    claimed_since: datetime | None = None,
) -> list[str]:
    """Extend the leases the worker holds; returns the ids extended.

    With ``running`` (what the daemon says it runs) and ``prefetched`` (what it holds
    waiting for a slot), only those, and the ones claimed at or after ``claimed_since``
    (their claim's answer may still be on its way), are extended; see :func:`hand_back`
    for the rest. The ``running`` ones are recorded as begun; without ``prefetched`` (a
    daemon that does not tell them apart) every listed one is, and without ``running``
    every lease the worker holds."""
    held: list[ColumnElement[bool]] = [C.worker_id == worker_id, C.state == "running"]
    begun: Any = C.attempts
    if running is not None:
        listed = [*running, *(prefetched or ())]
        recent = C.started_at >= claimed_since if claimed_since else None
        held.append(C.id.in_(listed) if recent is None else or_(C.id.in_(listed), recent))
        begun = case((C.id.in_(list(running)), C.attempts), else_=C.begun_attempt)
        if not running:
            begun = C.begun_attempt
    done = await conn.execute(
        update(invocations)
        .where(*held)
        .values(lease_expires_at=now + timedelta(seconds=lease_s), begun_attempt=begun)
        .returning(C.id)
    )
    return sorted(done.scalars())


def _begun() -> ColumnElement[bool]:
    """The lease's attempt is known to have begun."""
    return C.begun_attempt == C.attempts


@dataclass(frozen=True)
class Reaped:
    """What :func:`reap_expired` did: ``counts`` by outcome (retried, failed), and
    ``by_queue``: (queue id, outcome) → how many; ``returned``: leases whose attempt never
    began, back in the queue with it uncounted, by queue id."""

    counts: dict[str, int]
    by_queue: dict[tuple[str, str], int]
    returned: dict[str, int] = field(default_factory=dict)


async def reap_expired(conn: AsyncConnection, now: datetime, *, limit: int = 1000) -> Reaped:
    """Return expired leases to pending (after a backoff) or fail them when attempts are spent.

    Only an attempt that began is charged: a lease its worker holds without having begun
    it (prefetched work, its daemon gone without a word) goes back at once with its
    attempt uncounted. A worker that does not prefetch begins what it claims at once, so
    its leases (and those of a worker no longer known) are all charged.

    The counts of each outcome, and ``by_queue``: (queue id, outcome) → how many, for the
    metrics' labels."""
    query = (
        select(*_CHARGED, C.worker_id, C.begun_attempt)
        .where(C.state == "running", C.lease_expires_at < now)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    rows = (await conn.execute(query)).all()
    prefetching = await _prefetching(conn, {row[5] for row in rows if row[5] is not None})
    charged: list[Charged] = []
    unbegun: list[str] = []
    for invocation_id, attempts, max_attempts, queue_id, policy, worker_id, begun in rows:
        if begun != attempts and worker_id in prefetching:
            unbegun.append(invocation_id)
        else:
            charged.append((invocation_id, attempts, max_attempts, queue_id, policy))
    counts, by_queue = await _charge_rows(conn, charged, now, LEASE_EXPIRED)
    returned: dict[str, int] = {}
    if unbegun:
        stmt = _handed_back(now).where(C.id.in_(unbegun), C.state == "running")
        work = partial(conn.execute, stmt.returning(C.queue_id))
        done = await isolated(conn, "returning unbegun leases", unbegun, work)
        for queue_id in done.scalars() if done is not None else ():
            returned[str(queue_id)] = returned.get(str(queue_id), 0) + 1
    return Reaped(counts, by_queue, returned)


async def _prefetching(conn: AsyncConnection, worker_ids: set[str]) -> set[str]:
    """Those of the workers (still known) that hold work ahead of a free slot."""
    if not worker_ids:
        return set()
    query = select(workers.c.id, workers.c.capabilities).where(workers.c.id.in_(worker_ids))
    return {
        str(worker_id)
        for worker_id, capabilities in (await conn.execute(query)).all()
        if isinstance(capabilities, dict) and capabilities.get("prefetch")
    }


# what charging a lease's attempt reads of its row: id, attempts, max attempts, queue id
# and the stored retry policy
_CHARGED = (C.id, C.attempts, C.max_attempts, C.queue_id, C.retry)
Charged = tuple[str, int, int, str, Any]


async def _charge_rows(
    conn: AsyncConnection,
    rows: Sequence[Charged],
    now: datetime,
    error: dict[str, Any],
) -> tuple[dict[str, int], dict[tuple[str, str], int]]:
    """Charge each row (:data:`Charged`) its attempt: back to pending after its policy's
    wait, or failed when its attempts are spent; one UPDATE for the failed and one (a
    row each) for the retried, each in a savepoint of its own. The counts by outcome
    (retried, failed) and by (queue id, outcome)."""
    failed: list[str] = []
    retried: list[dict[str, Any]] = []
    queue_of: dict[str, str] = {}
    for invocation_id, attempts, max_attempts, queue_id, stored in rows:
        policy = policy_of(stored, max_attempts)
        if after_failure(attempts, policy, retry=True, error=error) == "pending":
            at = now + timedelta(seconds=policy.wait_s(attempts, _JITTER.random()))
            retried.append({"b_id": invocation_id, "b_at": at})
        else:
            failed.append(invocation_id)
        queue_of[invocation_id] = queue_id
    counts = {"retried": 0, "failed": 0}
    by_queue: dict[tuple[str, str], int] = {}
    ended = {"lease_expires_at": None, "error": error}
    if failed:
        stmt = (
            update(invocations)
            .where(C.id.in_(failed), C.state == "running")
            .values(**ended, state="failed", finished_at=now)
        )
        work = partial(conn.execute, stmt)
        if await isolated(conn, "charging ended leases", failed, work) is not None:
            _counted(counts, by_queue, queue_of, failed, "failed")
    if retried:
        due = bindparam("b_at", type_=C.available_at.type)
        stmt = (
            update(invocations)
            .where(C.id == bindparam("b_id"), C.state == "running")
            .values(**ended, state="pending", worker_id=None, available_at=due)
        )
        ids = [row["b_id"] for row in retried]
        work = partial(conn.execute, stmt, retried)
        if await isolated(conn, "charging ended leases", ids, work) is not None:
            _counted(counts, by_queue, queue_of, ids, "retried")
    return counts, by_queue


def _counted(
    counts: dict[str, int],
    by_queue: dict[tuple[str, str], int],
    queue_of: dict[str, str],
    ids: Sequence[str],
    outcome: str,
) -> None:
    counts[outcome] += len(ids)
    for invocation_id in ids:
        key = (queue_of[invocation_id], outcome)
        by_queue[key] = by_queue.get(key, 0) + 1


async def charge(
    conn: AsyncConnection,
    worker_id: str,
    started: Collection[str],
    now: datetime,
    error: dict[str, Any],
) -> tuple[dict[str, int], dict[tuple[str, str], int], list[str]]:
    """A dead worker's begun attempts, charged: of what the worker still holds, those in
    ``started`` and those its heartbeats said had begun go back to pending after their
    backoff, or fail when their attempts are spent, with ``error``. The counts by
    outcome and by (queue id, outcome), and the ids charged."""
    query = (
        select(*_CHARGED)
        .where(
            C.worker_id == worker_id,
            C.state == "running",
            or_(C.id.in_(list(started)), _begun()) if started else _begun(),
        )
        .with_for_update()
    )
    rows: list[Charged] = [
        (str(i), int(a), int(m), str(q), p) for i, a, m, q, p in (await conn.execute(query)).all()
    ]
    counts, by_queue = await _charge_rows(conn, rows, now, error)
    return counts, by_queue, [str(row[0]) for row in rows]


def _handed_back(now: datetime) -> Any:
    """Back to pending, claimable now, the attempt the claim counted uncounted."""
    return update(invocations).values(
        state="pending",
        worker_id=None,
        lease_expires_at=None,
        available_at=now,
        attempts=C.attempts - 1,
        begun_attempt=None,
    )


async def hand_back(
    conn: AsyncConnection,
    worker_id: str,
    now: datetime,
    *,
    running: Collection[str] = (),
    claimed_before: datetime | None = None,
    unbegun_only: bool = False,
) -> list[str]:
    """Return the worker's running invocations to pending, claimable now, their attempt
    not counted (the worker stopped, or never ran them; the function did not fail). One
    queue id per invocation handed back.

    A worker still alive keeps what it says it is ``running`` and what it claimed at or
    after ``claimed_before``; the rest it holds without running: a claim whose answer
    never reached it (the server died as it answered, the connection dropped) or a result
    it could not deliver. ``unbegun_only`` keeps the leases its heartbeats said had begun
    (a dead worker's, charged by :func:`charge`)."""
    held: list[ColumnElement[bool]] = [C.worker_id == worker_id, C.state == "running"]
    if running:
        held.append(C.id.not_in(list(running)))
    if claimed_before is not None:
        held.append(C.started_at < claimed_before)
    if unbegun_only:
        held.append(C.begun_attempt.is_distinct_from(C.attempts))
    done = await conn.execute(_handed_back(now).where(*held).returning(C.queue_id))
    return [str(queue_id) for queue_id in done.scalars()]
