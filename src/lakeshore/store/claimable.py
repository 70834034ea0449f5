"""May this worker take this invocation now: the one rule, as one SQL expression.

A claim picks stored rows by it (``store.invocations.claim``); the hand-off of a fresh
submit to a waiting claim (``store.invocations.insert_one_handed``) asks it of the row
it is about to insert, whose columns are then the statement's parameters, and of the
queue's stored rows (nothing claimable there to take first). Both build the expression
here, once per statement and dialect, from a :class:`Candidate`: which columns (or
values) stand for the invocation, and the bind parameters for the moment and the
worker. A new rule is a new term in :func:`may_take`, never a second copy.

The terms: the invocation is ``pending``; it is due (``available_at``, the end of a
retry's backoff or a delayed submit's due time, not after ``now``); its queue
dispatches (``active`` or ``draining``); and, when a worker is named, the worker is
subscribed to the queue and holds fewer running invocations than it may. A claim
already knows its worker's subscriptions and free slots from the read that chose its
queues (``store.workers.claim_view``, which a claim needs anyway to choose them, steal
included) and leases at most the free slots, so it builds the expression without the
worker's terms; the hand-off, which reads nothing first, with them. What a token may
claim (``authPolicy``) is decided from the token's scopes, which the database never
sees: ``services.taskqueue.claims`` and ``services.taskqueue.handoff`` check it before
either statement.

A queue's ``admission.max_running`` and ``max_running_per_key`` (:class:`Limits`) are
counts of its running rows, all of them or a key's (:func:`running_in_queue`,
:func:`running_of_key`). A claim leases several rows at once, so it cannot ask them of
each row: it counts once, under a lock on the queue that every limited claim takes
first (PostgreSQL: :func:`lock_queue`, which ``SKIP LOCKED`` is not; SQLite: the write
lock), and leases at most what is left (``store.invocations.claim``). The hand-off asks
:func:`within_limits` of its one row in its statement; on PostgreSQL that statement
cannot take the lock before its snapshot, so a limited queue hands nothing there
(``counted=False``): the row goes in pending and a claim, woken, counts under the lock.

:func:`scheduled` is the other side of the due-time term: a delayed submit not due yet
(pending, never attempted, ``available_at`` after ``now``), which ``stats`` and the
elasticity signals count apart from ``pending`` (:func:`waiting`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    ColumnElement,
    and_,
    exists,
    func,
    literal_column,
    not_,
    or_,
    select,
)
from sqlalchemy.engine.default import DefaultDialect

from lakeshore.store.tables import invocations, queues, worker_queues

C = invocations.c
DISPATCHING = ("active", "draining")  # a queue whose pending work may be claimed
_PLAIN = DefaultDialect()


@dataclass(frozen=True)
class Candidate:
    """What stands for the invocation in the rule: a stored row's columns, or the
    values of a row about to be inserted (bind parameters)."""

    state: ColumnElement[Any]
    available_at: ColumnElement[Any]
    queue_id: ColumnElement[Any]


@dataclass(frozen=True)
class Taker:
    """The worker the rule asks about, as bind parameters: its id and how many
    invocations it may hold at once."""

    worker_id: ColumnElement[Any]
    holds: ColumnElement[Any]


STORED = Candidate(state=C.state, available_at=C.available_at, queue_id=C.queue_id)


def _word(value: str) -> ColumnElement[Any]:
    # a constant written into the text, not a parameter: the expression also goes,
    # as text, into statements written by hand (store.invocations' hand-off)
    return literal_column(f"'{value}'")


PENDING, RUNNING = _word("pending"), _word("running")


def may_take(
    row: Candidate, now: ColumnElement[Any], taker: Taker | None = None
) -> ColumnElement[bool]:
    """The rule, over ``row`` at ``now``; with ``taker``, for that worker."""
    terms: list[ColumnElement[bool]] = [
        row.state == PENDING,
        row.available_at <= now,
        exists().where(
            queues.c.id == row.queue_id, queues.c.state.in_([_word(s) for s in DISPATCHING])
        ),
    ]
    if taker is not None:
        running = (
            select(func.count())
            .select_from(invocations)
            .where(C.worker_id == taker.worker_id, C.state == RUNNING)
            .scalar_subquery()
        )
        terms += [
            exists().where(
                worker_queues.c.worker_id == taker.worker_id,
                worker_queues.c.queue_id == row.queue_id,
            ),
            running < taker.holds,
        ]
    return and_(*terms)


@dataclass(frozen=True)
class Limits:
    """A queue's running limits (``admission.max_running``, ``max_running_per_key``)."""

    max_running: int | None = None
    per_key: int | None = None

    @classmethod
    def of(cls, admission: Mapping[str, Any] | None) -> Limits:
        admission = admission or {}
        return cls(admission.get("max_running"), admission.get("max_running_per_key"))

    @property
    def any(self) -> bool:
        return self.max_running is not None or self.per_key is not None


NO_LIMITS = Limits()
# pg_advisory_xact_lock(class, queue): the class of a queue's running-limit lock (the
# two-int4 keys do not share a space with the leadership's bigint keys)
LIMIT_LOCK_CLASS = 0x1A4E


def lock_queue(queue_id: ColumnElement[Any]) -> ColumnElement[Any]:
    """PostgreSQL: hold the queue's running-limit lock until the transaction ends."""
    return func.pg_advisory_xact_lock(
        literal_column(str(LIMIT_LOCK_CLASS)), func.hashtext(queue_id)
    )


def running_in_queue(queue_id: ColumnElement[Any]) -> ColumnElement[Any]:
    """How many of the queue's invocations run (leased, prefetched included)."""
    alias = invocations.alias("running_q")
    return (
        select(func.count())
        .select_from(alias)
        .where(alias.c.queue_id == queue_id, alias.c.state == RUNNING)
        .scalar_subquery()
    )


def running_of_key(queue_id: ColumnElement[Any], key: ColumnElement[Any]) -> ColumnElement[Any]:
    """How many of the queue's invocations of ``key`` run (``ix_invocations_running_key``,
    whose condition the terms repeat)."""
    alias = invocations.alias("running_k")
    return (
        select(func.count())
        .select_from(alias)
        .where(
            alias.c.queue_id == queue_id,
            alias.c.state == RUNNING,
            alias.c.concurrency_key.is_not(None),
            alias.c.concurrency_key == key,
        )
        .scalar_subquery()
    )


def within_limits(
    queue_id: ColumnElement[Any],
    key: ColumnElement[Any],
    max_running: ColumnElement[Any],
    per_key: ColumnElement[Any],
    *,
    counted: bool = True,
) -> ColumnElement[bool]:
    """One more invocation of ``key`` (null: none) in the queue stays within its limits
    (either null: not set). ``counted=False``: only when no limit applies to it (a
    statement whose counts could miss a claim committing beside it)."""
    no_key = key.is_(None)
    if not counted:
        return and_(max_running.is_(None), or_(no_key, per_key.is_(None)))
    return and_(
        or_(max_running.is_(None), running_in_queue(queue_id) < max_running),
        or_(no_key, per_key.is_(None), running_of_key(queue_id, key) < per_key),
    )


def scheduled(now: Any) -> ColumnElement[bool]:
    """A delayed submit not due yet at ``now``: pending, never attempted, and
    ``available_at`` after ``now`` (a retry waiting out its backoff has attempts)."""
    return and_(C.state == PENDING, C.attempts == 0, C.available_at > now)


def waiting(now: Any) -> ColumnElement[bool]:
    """Pending and not :func:`scheduled`: what ``stats`` and the elasticity signals count
    as ``pending`` (a retry's backoff included, as before delays)."""
    return and_(C.state == PENDING, or_(C.attempts > 0, not_(C.available_at > now)))


def as_text(expression: ColumnElement[Any]) -> str:
    """``expression`` as SQL text both stores parse, for a statement written by hand:
    its candidate, worker and moment given as text (``literal_column(":name")``) so the
    hand's own parameters stand in them."""
    compiled = expression.compile(dialect=_PLAIN, compile_kwargs={"literal_binds": True})
    return " ".join(str(compiled).split())
