"""Periodic schedules: their records (create, read, change, delete) and the leader's step
that enqueues their due slots.

Each slot is enqueued exactly once, with several replicas, a killed leader and a
restart. Only the server leading the cluster (:mod:`lakeshore.store.leadership`) runs
:func:`enqueue_due`; it submits each due slot through the ordinary submit
(:func:`lakeshore.services.taskqueue.invocations.submit_many`) with the idempotency key
``schedule:<name>:<slot>``, then moves the schedule's last slot past it. A leader
killed between the two leaves the last slot where it was: the next leader submits the
same slots again, and each repeated key answers with the invocation the first made,
adding none. A slot is only ever passed once it is enqueued (or skipped by
``catch_up``), so none goes missing either.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from sqlalchemy import RowMapping
from sqlalchemy.exc import IntegrityError

from lakeshore import logs
from lakeshore.domain import schedules as rules
from lakeshore.domain.ids import new_id
from lakeshore.errors import Conflict, InvalidInput, LakeshoreError, NotFound
from lakeshore.services.namespaces import Namespace
from lakeshore.services.taskqueue import invocations as submits
from lakeshore.services.taskqueue.notify import Notifier
from lakeshore.store import queues as queue_store
from lakeshore.store import schedules as schedule_store
from lakeshore.store.engine import Store
from lakeshore.store.leadership import Duty

log = logging.getLogger("lakeshore.schedules")

TICK_S: Final = 1.0  # how often the leader looks for due slots
_REFUSED: dict[str, str] = {}  # schedule id → the refusal last logged for it
_CLOSED: Final = ("draining", "archived")  # queues that take no submits


def _iso(moment: datetime) -> str:
    return rules.slot_text(moment)


@dataclass(frozen=True)
class Schedule:
    """A schedule as stored: its definition, queue and the last slot dealt with."""

    id: str
    queue: str
    spec: rules.ScheduleSpec
    last_slot: datetime
    created_at: datetime
    updated_at: datetime

    def to_json(self, now: datetime) -> dict[str, Any]:
        upcoming = rules.upcoming(self.spec, self.last_slot, now)
        return {
            **self.spec.to_json(),
            "queue": self.queue,
            "last_slot": _iso(self.last_slot),
            "next_slot": _iso(upcoming) if upcoming else None,
            "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
        }


def _spec_of(row: RowMapping) -> rules.ScheduleSpec:
    return rules.parse({**row["spec"], "enabled": row["enabled"]})


def _stored(spec: rules.ScheduleSpec) -> dict[str, Any]:
    return {k: v for k, v in spec.to_json().items() if k != "enabled" and v is not None}


def _from_row(row: RowMapping, queue: str) -> Schedule:
    return Schedule(
        id=row["id"],
        queue=queue,
        spec=_spec_of(row),
        last_slot=row["last_slot"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


async def _queue_id(conn: Any, ns: Namespace, queue: str) -> str:
    found = await queue_store.get_queue(conn, ns.id, queue)
    if found is None:
        raise NotFound(f'queue "{queue}" not found', field="queue")
    return found.id


async def _row(
    conn: Any, ns: Namespace, queue: str, name: str, *, lock: bool = False
) -> RowMapping:
    row = await schedule_store.get_schedule(conn, await _queue_id(conn, ns, queue), name, lock=lock)
    if row is None:
        raise NotFound(f'schedule "{name}" not found in queue "{queue}"', field="name")
    return row


async def create(store: Store, ns: Namespace, queue: str, body: Any, now: datetime) -> Schedule:
    """A new schedule of ``queue`` (404 without the queue, 409 when the name is taken).
    Its first slot is the first one after ``now``."""
    spec = rules.parse(body)
    now = now.astimezone(UTC)
    try:
        async with store.write() as conn:
            queue_id = await _queue_id(conn, ns, queue)
            if await schedule_store.get_schedule(conn, queue_id, spec.name) is not None:
                raise Conflict(
                    f'queue "{queue}" has a schedule "{spec.name}" already', field="name"
                )
            row = await schedule_store.insert_schedule(
                conn,
                {
                    "id": new_id("sch"),
                    "namespace_id": ns.id,
                    "queue_id": queue_id,
                    "name": spec.name,
                    "spec": _stored(spec),
                    "enabled": spec.enabled,
                    "last_slot": now,
                    "created_at": now,
                    "updated_at": now,
                },
            )
    except IntegrityError as exc:  # a racing create of the same name
        raise Conflict(
            f'queue "{queue}" has a schedule "{spec.name}" already', field="name"
        ) from exc
    return _from_row(row, queue)


async def list_for_queue(store: Store, ns: Namespace, queue: str) -> list[Schedule]:
    async with store.read() as conn:
        rows = await schedule_store.list_for_queue(conn, await _queue_id(conn, ns, queue))
    return [_from_row(row, queue) for row in rows]


async def get(store: Store, ns: Namespace, queue: str, name: str) -> Schedule:
    async with store.read() as conn:
        return _from_row(await _row(conn, ns, queue, name), queue)


async def patch(
    store: Store, ns: Namespace, queue: str, name: str, changes: Any, now: datetime
) -> Schedule:
    """Change the fields given. A schedule resumed (``enabled`` made true) starts from
    ``now``: the slots of its pause are not enqueued. So does one given a new timing
    (``cron``, ``every_s``, ``timezone``): the new slots start after ``now``, and the time
    since the last slot is not replayed on them."""
    now = now.astimezone(UTC)
    async with store.write() as conn:
        row = await _row(conn, ns, queue, name, lock=True)
        before = _spec_of(row)
        spec = rules.patched(before, changes)
        resumed = spec.enabled and not before.enabled
        retimed = (spec.cron, spec.every_s, spec.timezone) != (
            before.cron,
            before.every_s,
            before.timezone,
        )
        await schedule_store.update_schedule(
            conn,
            row["id"],
            spec=_stored(spec),
            enabled=spec.enabled,
            now=now,
            last_slot=max(row["last_slot"], now) if resumed or retimed else None,
        )
        updated = await schedule_store.get_by_id(conn, row["id"])
    assert updated is not None
    return _from_row(updated, queue)


async def delete(store: Store, ns: Namespace, queue: str, name: str) -> None:
    async with store.write() as conn:
        row = await _row(conn, ns, queue, name)
        await schedule_store.delete_schedule(conn, row["id"])


async def next_slots(
    store: Store, ns: Namespace, queue: str, now: datetime
) -> list[dict[str, Any]]:
    """Each of the queue's schedules with its next slot (null while paused), for
    ``stats`` and ``explain``."""
    return [
        {"name": s.spec.name, "next_slot": s.to_json(now)["next_slot"]}
        for s in await list_for_queue(store, ns, queue)
    ]


def validate(body: Any) -> rules.ScheduleSpec:
    """A schedule's definition, checked as a create would (for ``apply --dry-run``)."""
    if not isinstance(body, dict):
        raise InvalidInput("a schedule is a JSON object")
    return rules.parse(body)


# the leader's step ------------------------------------------------------------------


@dataclass(frozen=True)
class Enqueued:
    """What one step did for one schedule."""

    namespace: str
    queue: str
    schedule: str
    slots: tuple[datetime, ...]
    invocations: tuple[str, ...]
    skipped: int = 0


async def enqueue_due(
    store: Store,
    notifier: Notifier,
    now: datetime,
) -> list[Enqueued]:
    """Enqueue every schedule's due slots at ``now`` (see the module's docstring); only
    the cluster's leader calls it. A schedule whose submit is refused (its queue full
    or draining) keeps the slots not enqueued for the next step; the others go on."""
    now = now.astimezone(UTC)
    async with store.read() as conn:
        rows = await schedule_store.all_schedules(conn)
    done = []
    for row in rows:
        try:
            outcome = await _enqueue_one(store, notifier, row, now)
        except Exception:
            log.exception(
                "schedule %s of queue %s: enqueueing its due slots failed",
                row["name"],
                row["queue_name"],
                extra=logs.ids(namespace=row["namespace_name"], queue=row["queue_name"]),
            )
            continue
        if outcome is not None:
            done.append(outcome)
    return done


async def _enqueue_one(
    store: Store, notifier: Notifier, row: RowMapping, now: datetime
) -> Enqueued | None:
    spec = _spec_of(row)
    due = rules.due(spec, row["last_slot"], now)
    if due.last == row["last_slot"]:
        return None
    slots = () if row["queue_state"] in _CLOSED else due.slots  # a closed queue skips
    ns = Namespace(id=row["namespace_id"], name=row["namespace_name"], created_at=now)
    made: list[str] = []
    last = due.last
    for position, slot in enumerate(slots):
        body = {"fn": spec.fn, "args": list(spec.args), "kwargs": dict(spec.kwargs or {})}
        body["key"] = rules.slot_key(spec.name, slot)
        try:
            [(invocation, _)] = await submits.submit_many(
                store, notifier, ns, row["queue_name"], [body], now, block_s=0.0
            )
        except LakeshoreError as exc:
            # a queue that stays full refuses every step: said once, until it changes
            said = _REFUSED.get(row["id"]) == exc.message
            _REFUSED[row["id"]] = exc.message
            log.log(
                logging.DEBUG if said else logging.WARNING,
                "schedule %s: the slot %s was refused (%s); retried on the next step",
                spec.name,
                _iso(slot),
                exc.message,
                extra=logs.ids(namespace=ns.name, queue=row["queue_name"]),
            )
            if position == 0:
                return None
            last = slots[position - 1]
            break
        made.append(invocation["id"])
    if made:
        _REFUSED.pop(row["id"], None)
    async with store.write() as conn:  # both, or neither: a repeat marks the same rows
        await schedule_store.mark_made(conn, spec.name, list(zip(made, slots, strict=False)))
        await schedule_store.advance(conn, row["id"], was=row["last_slot"], to=last)
    return Enqueued(
        namespace=ns.name,
        queue=row["queue_name"],
        schedule=spec.name,
        slots=tuple(slots[: len(made)]),
        invocations=tuple(made),
        skipped=due.skipped,
    )


async def run_forever(
    store: Store,
    notifier: Notifier,
    duty: Duty,
    clock: Callable[[], datetime],
    *,
    interval_s: float = TICK_S,
    working: asyncio.Lock | None = None,
) -> None:
    """Every ``interval_s``, while this server does the cluster's housekeeping, enqueue
    the due slots.
    ``working`` is held through each step (the server stops the loop between two).

    The lead (``duty``: the cluster's housekeeping) is taken and checked by
    :mod:`.leading`'s loop, every elasticity interval; this loop only reads it. Trying
    for the lock here too would open a connection to PostgreSQL every second on every
    replica that does not lead. A leader
    that lost its lock without knowing it yet may step once more beside the new one: the
    slots' keys make that harmless."""
    working = working or asyncio.Lock()
    while True:
        try:
            async with working:
                if duty.leading:
                    for outcome in await enqueue_due(store, notifier, clock()):
                        _log(outcome)
        except Exception:
            log.exception("schedule step failed; the next one runs on time")
        await asyncio.sleep(interval_s)


def _log(outcome: Enqueued) -> None:
    if outcome.slots or outcome.skipped:
        log.info(
            "schedule %s enqueued %d slot(s) %s, skipped %d",
            outcome.schedule,
            len(outcome.slots),
            ", ".join(_iso(slot) for slot in outcome.slots),
            outcome.skipped,
            extra=logs.ids(namespace=outcome.namespace, queue=outcome.queue),
        )
