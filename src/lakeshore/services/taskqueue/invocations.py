"""The task queue's client side: submit (one or many), read, list, cancel."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import MutableMapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from lakeshore import logs
from lakeshore.domain import access, admission, cursors, jsonsafe
from lakeshore.domain import retry as retries
from lakeshore.domain.ids import new_id, new_ids
from lakeshore.domain.invocations import (
    Submit,
    due_at,
    parse_submits,
    priority_of,
    retry_policy,
)
from lakeshore.domain.names import NAME_RULE, is_valid_name
from lakeshore.domain.queue import Queue, parse_spec
from lakeshore.errors import Conflict, InvalidInput, LakeshoreError, NotFound, TooManyRequests
from lakeshore.services.auth import Principal
from lakeshore.services.metrics import Metrics
from lakeshore.services.namespaces import Namespace
from lakeshore.services.taskqueue.handoff import Waiter, Waiting
from lakeshore.services.taskqueue.notify import Notifier
from lakeshore.store import invocations as inv_store
from lakeshore.store import queues as queue_store
from lakeshore.store import rate_buckets, wakeups
from lakeshore.store.engine import Store

log = logging.getLogger("lakeshore.invocations")

MAX_BATCH = 1000
DEFAULT_PAGE = 100
MAX_PAGE = 1000
PRIORITY_ORDERED = ("priority", "boltzmann")  # the kinds whose claims go by priority


def to_json(row: Any) -> dict[str, Any]:
    def iso(value: datetime | None) -> str | None:
        return value.isoformat() if value else None

    answer = {
        "id": row["id"],
        "queue": row["queue_name"],
        "fn": row["fn"],
        "args": row["args"],
        "kwargs": row["kwargs"],
        "priority": row["priority"],
        "key": row["key"],
        "state": row["state"],
        "attempts": row["attempts"],
        "max_attempts": row["max_attempts"],
        # the effective retry policy, fixed at submit
        "retry": retries.shown(row.get("retry"), row["max_attempts"]),
        "timeout_s": row["timeout_s"],
        "worker": row["worker_id"],
        "lease_expires_at": iso(row["lease_expires_at"]),
        "result": row["result"],
        "error": row["error"],
        "created_at": iso(row["created_at"]),
        "started_at": iso(row["started_at"]),
        "finished_at": iso(row["finished_at"]),
    }
    if row.get("concurrency_key") is not None:
        answer["concurrency_key"] = row["concurrency_key"]
    if row.get("schedule") is not None:  # made by a periodic schedule, for this slot
        answer["schedule"] = row["schedule"]
        answer["slot"] = iso(row["slot"])
    return answer


# Queues as submits last read them, with their revision, by (namespace id, name): what
# lets a single submit skip reading its queue (see _submit_to_known). A copy is only
# ever acted on while the row is still at its revision, so it needs no expiry to be
# right; the bound is on memory.
KnownQueues = MutableMapping[tuple[str, str], tuple[Queue, int]]


async def _queue_for_submit(
    conn: AsyncConnection, ns: Namespace, name: str, now: datetime
) -> tuple[Queue, int]:
    """The queue to submit to, created as fifo when it does not exist yet, and its
    revision. Its row stays locked until the submit commits (PostgreSQL; SQLite has one
    writer at a time), so the depth check and the insert are one step for concurrent
    submits."""
    if not is_valid_name(name):
        raise InvalidInput(f"{name!r} is not a valid queue name: use {NAME_RULE}", field="queue")
    found = await queue_store.get_queue_at(conn, ns.id, name, lock=True)
    if found is None:
        queue = await queue_store.insert_queue(
            conn, id=new_id("q"), namespace_id=ns.id, spec=parse_spec({"name": name}), now=now
        )
        found = (queue, 0)
    queue = found[0]
    if queue.state in ("draining", "archived"):
        raise Conflict(f'queue "{name}" is {queue.state} and accepts no submits', field="queue")
    return found


async def _submit_to_known(
    store: Store,
    notifier: Notifier,
    known: KnownQueues,
    ns: Namespace,
    queue_name: str,
    submits: Sequence[Submit],
    places: Sequence[str],
    now: datetime,
    caller: Principal | None,
    waiting: Waiting | None = None,
    *,
    ids_only: bool = False,
) -> list[tuple[dict[str, Any], bool]] | None:
    """Submits in one statement, decided on the copy of their queue that an earlier
    submit read: ``None`` when that copy cannot decide them, and the full path must.

    The full path costs five round trips on PostgreSQL (begin, read and lock the queue,
    insert, commit, besides the key check); this one, one: an insert that goes in only
    while the queue row is at the revision the copy was read at, holding the row shared
    until it commits (autocommit), so a change of the queue's spec or state waits for
    it, or it sees the change and inserts nothing. It takes only the submits whose
    outcome the copy settles without a count: an active or paused queue with no
    ``max_depth`` or ``rate_limit``, a caller its ``authPolicy`` admits, a priority it
    can place (no ``rate_limit_per_key`` either); of a batch, only one without keys
    whose submits fall due together (a key taken is read back by the full path).
    Anything else, a refusal included, goes the full way, which reads the queue afresh
    and answers with the current spec's reason. ``waiting``: the claims waiting in this
    server, the longest-waiting of which on this queue, if any, is handed a single
    submit's invocation when its worker may take it (:mod:`.handoff`)."""
    entry = known.get((ns.id, queue_name))
    if entry is None:
        return None
    queue, revision = entry
    if not _copy_decides(queue, submits):
        return None
    try:
        if caller is not None:
            caller.require_access(queue.spec.auth_policy, "submit", queue.name)
        rows = _rows(ns, queue, submits, now, places)
    except LakeshoreError:
        return None
    waiter = None
    if waiting is not None and queue.state == "active" and len(rows) == 1:
        waiter = waiting.take(queue.id, queue.name, queue.spec.auth_policy)
    stored: list[dict[str, Any]] | None = None
    answer = None
    try:
        stored = await _insert_at(store, rows, revision, waiter)
        if stored is not None and len(stored) == 1:
            answer = to_json(stored[0])
    finally:
        if waiter is not None:
            given = answer is not None and answer["state"] == "running"
            Waiting.settle(waiter, [answer] if answer is not None and given else [])
    if stored is None:  # the queue moved on, or the key is taken
        known.pop((ns.id, queue_name), None)
        return None
    if answer is None:  # a batch, pending
        notifier.notify([queue.id])
        return _answers(rows, stored, ids_only=ids_only)
    await _announce(notifier, queue.id, answer, waiter)
    return [(answer, True)]


async def _insert_at(
    store: Store, rows: list[dict[str, Any]], revision: int, waiter: Waiter | None
) -> list[dict[str, Any]] | None:
    """``rows`` in one statement while their queue is at ``revision``; the one row
    leased to ``waiter``'s worker when it may take it now."""
    async with store.statement() as conn:
        if waiter is None:
            return await inv_store.insert_at(conn, rows, revision)
        handed = await inv_store.insert_one_handed(
            conn,
            rows[0],
            revision,
            worker_id=waiter.worker_id,
            holds=waiter.holds,
            lease_s=waiter.lease_s,
        )
    return None if handed is None else [handed]


def _copy_decides(queue: Queue, submits: Sequence[Submit]) -> bool:
    """Whether a copy of ``queue`` settles ``submits`` without a count or a read-back
    (:func:`_submit_to_known`)."""
    limits = queue.spec.admission
    if queue.state in ("draining", "archived") or (
        limits is not None
        and (
            limits.max_depth is not None
            or limits.rate_limit is not None
            or limits.rate_limit_per_key is not None
        )
    ):
        return False
    return len(submits) == 1 or not any(
        s.key is not None or s.delay_s is not None or s.not_before is not None for s in submits
    )


async def _announce(
    notifier: Notifier, queue_id: str, answer: dict[str, Any], waiter: Waiter | None
) -> None:
    """Wake the claims waiting for work when the row went in pending (a row handed on
    is no other claim's to take); else let the claim it was handed answer first: that
    answer starts the work."""
    if answer["state"] == "pending":
        notifier.notify([queue_id])
    elif waiter is not None:
        await Waiting.answer_first(waiter)


def _rows(
    ns: Namespace, queue: Queue, submits: Sequence[Submit], now: datetime, places: Sequence[str]
) -> list[dict[str, Any]]:
    """The rows to insert, one per submit, in order."""
    field = queue.spec.kind_params.priority_field if queue.spec.kind_params else None
    ordered = queue.spec.kind in PRIORITY_ORDERED
    ids = new_ids("inv", len(submits))
    rows = []
    queue_retry = queue.spec.retry
    # the last policy and its stored form: a batch's submits mostly share one
    last: tuple[retries.RetryPolicy, dict[str, Any] | None] = (retries.DEFAULT, None)
    queue_name = queue.name
    created_at = now  # a microsecond apart, so a batch keeps its order in fifo and filo queues
    for position, (submit, where) in enumerate(zip(submits, places, strict=True)):
        kwargs = submit.kwargs
        policy = retry_policy(submit, queue_retry)
        if policy is not last[0] and policy != last[0]:
            last = (policy, retries.stored(policy))
        rows.append(
            {
                "id": ids[position],
                "namespace_id": ns.id,
                "queue_id": queue.id,
                "queue_name": queue_name,
                "fn": submit.fn,
                "args": submit.args,
                "kwargs": kwargs,
                # no kwargs (a common submit), no priority
                "priority": priority_of(kwargs, field, ordered=ordered, where=where)
                if kwargs
                else 0.0,
                "key": submit.key,
                "state": "pending",
                "attempts": 0,
                "max_attempts": policy.max_attempts,
                "retry": last[1],
                "concurrency_key": submit.concurrency_key,
                "timeout_s": submit.timeout_s,
                # a delayed submit's due time (claimable from then on), else now
                "available_at": now
                if submit.delay_s is None and submit.not_before is None
                else due_at(submit, now, where=where),
                "created_at": created_at,
            }
        )
        created_at += _MICROSECOND
    return rows


_MICROSECOND = timedelta(microseconds=1)


class _Full(Exception):
    """The queue is at max_depth and its on_full is block."""


async def _admit(
    conn: AsyncConnection, queue: Queue, adding: Sequence[Submit], now: datetime
) -> None:
    """Pace the submits that add rows by the queue's ``rate_limit`` and each concurrency
    key's ``rate_limit_per_key``: tokens taken from buckets in the store, in the submit's
    transaction, so every replica admits from the same buckets (a refusal rolls every
    take back with it)."""
    limits = queue.spec.admission
    if limits is None or not adding:
        return
    if limits.rate_limit is not None:
        wait = await rate_buckets.take(
            conn, queue.id, rate_buckets.QUEUE, limits.rate_limit, len(adding), now
        )
        if wait > 0:
            raise TooManyRequests(
                f'queue "{queue.name}" takes {limits.rate_limit:g} submits a second; '
                f"retry in {wait:.2f} s",
                field="admission.rate_limit",
                retry_after=wait,
            )
    if limits.rate_limit_per_key is not None:
        keys = Counter(s.concurrency_key for s in adding if s.concurrency_key is not None)
        for key, count in sorted(keys.items()):  # always in one order: no deadlock
            rate = limits.rate_limit_per_key
            wait = await rate_buckets.take(conn, queue.id, key, rate, count, now)
            if wait > 0:
                raise TooManyRequests(
                    f'concurrency key "{key}" of queue "{queue.name}" takes {rate:g} '
                    f"submits a second; retry in {wait:.2f} s",
                    field="admission.rate_limit_per_key",
                    retry_after=wait,
                )


async def _adding(conn: AsyncConnection, queue: Queue, submits: Sequence[Submit]) -> list[Submit]:
    """The submits that would add a row: a key already used in the queue adds none (its
    submit answers with the invocation that holds it)."""
    keys = {s.key for s in submits if s.key is not None}
    known = await inv_store.existing_keys(conn, queue.id, keys) if keys else set()
    return [s for s in submits if s.key is None or s.key not in known]


async def _check_depth(conn: AsyncConnection, queue: Queue, incoming: int) -> None:
    """Room for ``incoming`` new rows."""
    limits = queue.spec.admission
    if limits is None or limits.max_depth is None or incoming == 0:
        return
    pending = await queue_store.pending_count(conn, queue.id)
    if admission.has_room(pending=pending, incoming=incoming, max_depth=limits.max_depth):
        return
    if limits.on_full == "block":
        raise _Full
    raise TooManyRequests(
        f'queue "{queue.name}" is full: {pending} pending, max_depth {limits.max_depth}',
        field="admission.max_depth",
    )


def _places(count: int) -> list[str]:
    """Where each submit of a request is, in the fields refusals name."""
    return [f"invocations[{i}]" for i in range(count)] if count > 1 else [""] * count


async def submit_many(
    store: Store,
    notifier: Notifier,
    ns: Namespace,
    queue_name: str,
    bodies: Sequence[Any],
    now: datetime,
    *,
    block_s: float = 10.0,
    ids_only: bool = False,
    max_payload_bytes: int | None = None,
    caller: Principal | None = None,
    known: KnownQueues | None = None,
    waiting: Waiting | None = None,
) -> list[tuple[dict[str, Any], bool]]:
    """Submit ``bodies`` in order; each result is (invocation, created?). A body whose key
    was already used in this queue returns the invocation that holds it. A full queue
    whose ``on_full`` is ``block`` is retried for up to ``block_s`` seconds, then 429.
    ``caller`` is held to the queue's ``authPolicy.submit`` (403). ``known`` keeps the
    queues submits read, for a single submit to be decided in one statement (and
    handed to a claim in ``waiting``, see :mod:`.handoff`).
    ``ids_only``: each invocation is answered as its ``{"id": …}`` alone."""
    if not 1 <= len(bodies) <= MAX_BATCH:
        raise InvalidInput(f"a batch holds 1 to {MAX_BATCH} invocations", field="invocations")
    now = now.astimezone(UTC)  # the answers' times read as the store's would
    places = _places(len(bodies))
    submits = parse_submits(bodies, places)
    if max_payload_bytes is not None:
        _check_sizes(submits, max_payload_bytes)
    if known is not None:
        answers = await _submit_to_known(
            store,
            notifier,
            known,
            ns,
            queue_name,
            submits,
            places,
            now,
            caller,
            waiting,
            ids_only=ids_only,
        )
        if answers is not None:
            return answers
    queue, revision, rows, stored = await _submit_reading_queue(
        store, ns, queue_name, submits, places, now, block_s=block_s, caller=caller
    )
    if known is not None:
        known[(ns.id, queue.name)] = (queue, revision)
    notifier.notify([queue.id])
    return _answers(rows, stored, ids_only=ids_only)


async def _submit_reading_queue(
    store: Store,
    ns: Namespace,
    queue_name: str,
    submits: Sequence[Submit],
    places: Sequence[str],
    now: datetime,
    *,
    block_s: float,
    caller: Principal | None,
) -> tuple[Queue, int, list[dict[str, Any]], Sequence[Any]]:
    """The full path: one transaction that reads (and locks) the queue, checks the
    submits against it, and inserts them. Returns the queue, its revision, the rows
    made and the rows stored."""
    loop = asyncio.get_running_loop()
    deadline, pause, races = loop.time() + block_s, 0.05, 0
    while True:
        try:
            async with store.write() as conn:
                queue, revision = await _queue_for_submit(conn, ns, queue_name, now)
                if caller is not None:
                    caller.require_access(queue.spec.auth_policy, "submit", queue.name)
                # before admission: a submit refused for its priority spends no rate
                rows = _rows(ns, queue, submits, now, places)
                # repeats of a used key are answered, never refused: only new rows are
                # held to max_depth and paced by rate_limit
                adding = await _adding(conn, queue, submits)
                await _check_depth(conn, queue, len(adding))
                await _admit(conn, queue, adding, now)
                stored = await inv_store.insert_many(conn, rows)  # publishes the wake-up
            return queue, revision, rows, stored
        except IntegrityError:  # a racing create of the same queue: retried, not surfaced
            races += 1
            if races == 3:
                raise
        except _Full:
            if loop.time() + pause > deadline:
                raise TooManyRequests(
                    f'queue "{queue_name}" stayed full for {block_s:g} s (on_full: block)',
                    field="admission.max_depth",
                    retry_after=1.0,
                ) from None
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.5)


_EMPTY_PAYLOAD = len(jsonsafe.stored([[], {}]))


def _check_sizes(submits: Sequence[Submit], max_payload_bytes: int) -> None:
    for i, s in enumerate(submits):
        if not s.args and not s.kwargs and max_payload_bytes >= _EMPTY_PAYLOAD:
            continue  # no arguments: nothing to measure
        where = f"invocations[{i}]" if len(submits) > 1 else "args"
        jsonsafe.require_within(
            [s.args, s.kwargs],
            max_payload_bytes,
            f"the args and kwargs of {where if len(submits) > 1 else 'this invocation'}",
            setting="LAKESHORE_MAX_PAYLOAD_BYTES",
            field=where,
        )


def _answers(
    rows: Sequence[dict[str, Any]], stored: Sequence[Any], *, ids_only: bool = False
) -> list[tuple[dict[str, Any], bool]]:
    """Each submit's invocation (``ids_only``: its id alone, what the SDK asks of a
    batch, without turning each row into JSON for nothing) and whether it was created
    by it: a key twice in one batch is created once, and the second gets the same
    invocation."""
    made = {row["id"] for row in rows}
    answers, seen = [], set()
    for row in stored:
        invocation = {"id": row["id"]} if ids_only else to_json(row)
        answers.append((invocation, row["id"] in made and row["id"] not in seen))
        seen.add(row["id"])
    return answers


async def get(
    store: Store, ns: Namespace, invocation_id: str, caller: Principal | None = None
) -> dict[str, Any]:
    async with store.read() as conn:
        row = await inv_store.get(conn, ns.id, invocation_id)
        if row is None:
            raise NotFound(f'invocation "{invocation_id}" not found', field="id")
        await require_access(conn, caller, ns, row["queue_name"], "read")
    return to_json(row)


async def require_access(
    conn: AsyncConnection,
    caller: Principal | None,
    ns: Namespace,
    queue_name: str,
    action: access.Action,
) -> None:
    """403 unless the queue's ``authPolicy`` lets ``caller`` do ``action`` (no read for
    the admin, whom no policy refuses)."""
    if caller is None or caller.is_admin:
        return
    queue = await queue_store.get_queue(conn, ns.id, queue_name)
    if queue is not None:
        caller.require_access(queue.spec.auth_policy, action, queue.name)


async def _queue_for(
    conn: AsyncConnection,
    ns: Namespace,
    name: str,
    caller: Principal | None,
    action: access.Action,
) -> Queue:
    """The queue ``name`` (404 if there is none), if ``caller`` may do ``action`` (403)."""
    queue = await queue_store.get_queue(conn, ns.id, name) if is_valid_name(name) else None
    if queue is None:
        raise NotFound(f'queue "{name}" not found', field="name")
    if caller is not None:
        caller.require_access(queue.spec.auth_policy, action, queue.name)
    return queue


async def list_for_queue(
    store: Store,
    ns: Namespace,
    queue_name: str,
    *,
    states: Sequence[str],
    limit: int,
    cursor: str | None,
    caller: Principal | None = None,
) -> dict[str, Any]:
    before = cursors.parse(cursor)
    async with store.read() as conn:
        queue = await _queue_for(conn, ns, queue_name, caller, "read")
        rows = await inv_store.list_for_queue(
            conn, queue.id, states=states, limit=limit, before=before
        )
    next_cursor = None
    if len(rows) == limit:
        last = rows[-1]
        next_cursor = cursors.issue(last["created_at"], last["id"])
    return {"invocations": [to_json(row) for row in rows], "next_cursor": next_cursor}


def stream_key(invocation_id: str) -> str:
    """The notifier key of one invocation: its stream grew, or it ended."""
    return f"stream:{invocation_id}"


async def cancel(
    store: Store,
    notifier: Notifier,
    ns: Namespace,
    invocation_id: str,
    now: datetime,
    caller: Principal | None = None,
    metrics: Metrics | None = None,
) -> dict[str, Any]:
    async with store.write() as conn:
        row = await inv_store.get(conn, ns.id, invocation_id)
        if row is None:
            raise NotFound(f'invocation "{invocation_id}" not found', field="id")
        await require_access(conn, caller, ns, row["queue_name"], "submit")
        if row["state"] in ("succeeded", "failed", "expired"):
            raise Conflict(f"invocation already {row['state']}; nothing to cancel", field="state")
        updated = await inv_store.cancel(conn, invocation_id, now)
        await wakeups.publish(conn, [stream_key(invocation_id)])
    assert updated is not None
    notifier.notify([stream_key(invocation_id)])
    if metrics is not None and row["state"] != updated["state"]:
        metrics.outcomes.labels(ns.name, row["queue_name"], "cancelled").inc()
    return to_json(updated)


RETRY_BATCH = 500  # a bulk action's rows per transaction


async def retry(
    store: Store,
    notifier: Notifier,
    ns: Namespace,
    invocation_id: str,
    now: datetime,
    caller: Principal | None = None,
) -> dict[str, Any]:
    """A new attempt of a failed, expired or cancelled invocation: same id, same key,
    pending at the back of its queue (see :func:`lakeshore.store.invocations.retry`).
    409 for one that is pending, running or succeeded."""
    async with store.write() as conn:
        row = await inv_store.get(conn, ns.id, invocation_id)
        if row is None:
            raise NotFound(f'invocation "{invocation_id}" not found', field="id")
        await require_access(conn, caller, ns, row["queue_name"], "submit")
        if row["state"] not in inv_store.RETRYABLE:
            raise Conflict(
                f"invocation is {row['state']}: only a failed, expired or cancelled "
                "invocation can be retried",
                field="state",
            )
        changed = await inv_store.retry(conn, [invocation_id], now)
        if not changed:  # it changed state since it was read
            raise Conflict("invocation changed meanwhile; read it and try again", field="state")
        await wakeups.publish(conn, [row["queue_id"], stream_key(invocation_id)])
    notifier.notify([row["queue_id"], stream_key(invocation_id)])
    return to_json(changed[0])


BULK_STATES = {"retry": inv_store.RETRYABLE, "cancel": ("pending", "running")}


async def bulk(
    store: Store,
    notifier: Notifier,
    ns: Namespace,
    queue_name: str,
    action: str,
    state: str,
    now: datetime,
    caller: Principal | None = None,
    metrics: Metrics | None = None,
) -> int:
    """Retry or cancel every invocation of a queue in ``state``, ``RETRY_BATCH`` per
    transaction until none is left; how many it changed. Each batch commits by itself,
    so a stop half-way leaves every invocation either done or as it was."""
    allowed = BULK_STATES.get(action)
    if allowed is None:
        raise InvalidInput(f"action is one of {', '.join(BULK_STATES)}", field="action")
    if state not in allowed:
        raise InvalidInput(f"{action} takes state {' or '.join(allowed)}", field="state")
    async with store.read() as conn:
        queue = await _queue_for(conn, ns, queue_name, caller, "submit")
    touched, seen = 0, set[str]()
    while True:
        async with store.write() as conn:
            ids = [
                i
                for i in await inv_store.ids_in_state(conn, queue.id, state, RETRY_BATCH)
                if i not in seen
            ]
            if not ids:
                break
            seen.update(ids)
            if action == "retry":
                changed = [row["id"] for row in await inv_store.retry(conn, ids, now)]
            else:
                changed = [
                    i
                    for i in ids
                    if (row := await inv_store.cancel(conn, i, now)) is not None
                    and row["state"] == "cancelled"
                ]
            keys = [queue.id, *(stream_key(i) for i in changed)]
            await wakeups.publish(conn, keys)
        notifier.notify(keys)
        touched += len(changed)
    if metrics is not None and action == "cancel" and touched:
        metrics.outcomes.labels(ns.name, queue.name, "cancelled").inc(touched)
    log.info(
        "bulk %s of %d %s invocation(s)",
        action,
        touched,
        state,
        extra=logs.ids(namespace=ns.name, queue=queue.name),
    )
    return touched
