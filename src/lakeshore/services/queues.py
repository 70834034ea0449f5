"""Queue records: create, read, change, and move through their lifecycle."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from lakeshore.domain import fleet, states
from lakeshore.domain import runners as daemon_runners
from lakeshore.domain.ids import new_id
from lakeshore.domain.names import is_valid_name
from lakeshore.domain.queue import Queue, QueueSpec, merge_patch, parse_spec
from lakeshore.domain.states import Transition
from lakeshore.errors import Conflict, InvalidInput, NotFound
from lakeshore.services.fleet import scopes
from lakeshore.services.fleet.scalers import Registry as ScalerRegistry
from lakeshore.services.fleet.scopes import scope_of
from lakeshore.services.namespaces import Namespace
from lakeshore.store import controller as ctl_store
from lakeshore.store import invocations as inv_store
from lakeshore.store import queues as queue_store
from lakeshore.store import tallies
from lakeshore.store.engine import Store

DEFAULT_PAGE: Final = 100
MAX_PAGE: Final = 1000


def _not_found(name: str) -> NotFound:
    return NotFound(f'queue "{name}" not found', field="name")


async def _load(conn: AsyncConnection, ns: Namespace, name: str) -> Queue:
    """The queue ``name`` in ``ns``, or 404 (a name no queue could have is simply absent)."""
    queue = await queue_store.get_queue(conn, ns.id, name) if is_valid_name(name) else None
    if queue is None:
        raise _not_found(name)
    return queue


def _taken(name: str) -> Conflict:
    return Conflict(f'queue "{name}" already exists in this namespace', field="name")


async def create(
    store: Store,
    ns: Namespace,
    body: Any,
    now: datetime,
    *,
    scalers: ScalerRegistry | None = None,
) -> Queue:
    spec = parse_spec(body)
    if scalers is not None:
        scalers.check(spec.custom_scaler_udf)
    _check_runners(spec)
    try:
        async with store.write() as conn:
            existing = await queue_store.get_queue(conn, ns.id, spec.name)
            if existing is not None:
                hint = (
                    " (archived: unarchive it to use it again)"
                    if existing.state == "archived"
                    else ""
                )
                raise Conflict(
                    f'queue "{spec.name}" already exists in this namespace{hint}', field="name"
                )
            return await queue_store.insert_queue(
                conn, id=new_id("q"), namespace_id=ns.id, spec=spec, now=now
            )
    except IntegrityError as exc:
        raise _taken(spec.name) from exc


def _check_runners(spec: QueueSpec) -> None:
    """A queue whose daemons Lakeshore launches (a ``providerRef``, or the template's own
    ``provider``) names only runners a Lakeshore daemon has (422 otherwise)."""
    template = spec.daemon_template
    if template is not None and (spec.provider_ref or template.provider):
        daemon_runners.require_known(
            fleet.template_runners(template), field="daemonTemplate.runners"
        )


async def get(store: Store, ns: Namespace, name: str) -> Queue:
    async with store.read() as conn:
        return await _load(conn, ns, name)


@dataclass(frozen=True)
class QueuePage:
    """Queues in name order, and the cursor of the page after them (None: no more)."""

    queues: list[Queue]
    next_cursor: str | None


async def list_page(
    store: Store,
    ns: Namespace,
    *,
    include_archived: bool = False,
    limit: int = DEFAULT_PAGE,
    cursor: str | None = None,
) -> QueuePage:
    """A page of the namespace's queues by name. The cursor is the page's last name, so
    a queue created or archived meanwhile never shifts the pages after it; the same
    ``include_archived`` is expected with every page."""
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidInput(f"limit is 1-{MAX_PAGE}", field="limit")
    if cursor and not is_valid_name(cursor):
        raise InvalidInput("not a cursor this server issued", field="cursor")
    async with store.read() as conn:
        found = await queue_store.list_queues(
            conn, ns.id, include_archived=include_archived, after=cursor or None, limit=limit + 1
        )
    page = found[:limit]
    return QueuePage(page, page[-1].name if len(found) > limit else None)


async def patch(
    store: Store,
    ns: Namespace,
    name: str,
    body: Any,
    now: datetime,
    *,
    scalers: ScalerRegistry | None = None,
) -> Queue:
    async with store.write() as conn:
        queue = await _load(conn, ns, name)
        if queue.state == "archived":
            raise Conflict(f'queue "{name}" is archived (read-only); unarchive it first')
        spec = merge_patch(queue.spec, body)
        if scalers is not None and "customScalerUdf" in body:
            scalers.check(spec.custom_scaler_udf)
        _check_runners(spec)
        return await queue_store.update_spec(conn, queue, spec, now)


async def transition(
    store: Store, ns: Namespace, name: str, action: Transition, now: datetime
) -> Queue:
    async with store.write() as conn:
        queue = await _load(conn, ns, name)
        target = states.next_state(queue.state, action)
        if target == queue.state:
            return queue
        if target == "archived":
            counts = await tallies.counts(conn, queue.id)
            open_ = sum(counts.get(state, 0) for state in queue_store.OPEN_STATES)
            if open_:
                raise Conflict(
                    f'queue "{name}" still holds {open_} pending or running invocation'
                    f"{'s' if open_ != 1 else ''}; drain it before archiving",
                    field="state",
                )
        if states.resets_counters(queue.state, target):
            await ctl_store.reset_counters(conn, ns.id, sorted({queue.name, scope_of(queue)}))
        return await queue_store.update_state(conn, queue, target, now)


async def stats(store: Store, ns: Namespace, name: str, now: datetime) -> dict[str, Any]:
    """The signals the controller reads for the queue's scope, as they stand now: read by
    the controller's own code (:mod:`.scopes`), so they are what the next tick acts on."""
    queue, reading, counts = await read_scope(store, ns, name, now)
    return stats_json(queue, reading, counts, await scheduled_of(store, queue, now))


async def scheduled_of(store: Store, queue: Queue, now: datetime) -> int:
    """The queue's delayed submits not due yet at ``now`` (``stats``' ``scheduled``)."""
    async with store.read() as conn:
        return await inv_store.scheduled_count(conn, queue.id, now)


async def read_scope(
    store: Store, ns: Namespace, name: str, now: datetime, *, by_state: bool = True
) -> tuple[Queue, scopes.Reading, dict[str, int] | None]:
    """The queue, its scope as the plan reads it now, and its invocations by state (None
    unless ``by_state``; read from the queue's tally and its live rows, in time that does
    not grow with its history: :mod:`lakeshore.store.tallies`)."""
    async with store.read() as conn:
        queue = await _load(conn, ns, name)
        counts = await tallies.counts(conn, queue.id) if by_state else None
    return queue, await scopes.read(store, ns, queue, now), counts


def stats_json(
    queue: Queue,
    reading: scopes.Reading,
    counts: dict[str, int] | None,
    scheduled: int | None = None,
) -> dict[str, Any]:
    """``stats``' answer.

    Utilization counts the server's own running leases against the fleet's capacity,
    so it is right even when daemons do not report what they run; with no capacity it
    is 1.0 when work is waiting and 0.0 otherwise. For a queue in a pool, the signals are
    the pool's and ``member`` holds the queue's own counts; ``byState`` is always the
    queue's own. ``scheduled`` (the queue's own, None when not read): its delayed
    submits not due yet, which ``pending`` (and ``byState``'s) leaves out until due.
    """
    s = reading.signals
    answer: dict[str, Any] = {
        "queue": queue.name,
        "state": queue.state,
        "scope": reading.scope,
        "pending": s.pending,
        "scheduled": scheduled,
        "running": s.running,
        "daemonCount": s.daemon_count,
        "capacity": s.capacity,
        "utilization": round(s.utilization, 4),
        "inFlight": s.in_flight,
        "counters": {
            "consecutiveAbove": reading.counters.above,
            "consecutiveBelow": reading.counters.below,
        },
        "byState": None
        if counts is None
        else {
            state: counts.get(state, 0) - ((scheduled or 0) if state == "pending" else 0)
            for state in ("pending", "running", "succeeded", "failed", "cancelled", "expired")
        },
        "pool": None,
        "member": None,
    }
    if reading.scope != queue.name:  # in a pool: the queue's own counts, beside the pool's
        own = reading.own
        answer["pool"] = {"members": reading.members}
        answer["member"] = {
            "pending": own.pending,
            "running": own.running,
            "daemonCount": own.daemons,
            "capacity": own.capacity,
            "utilization": round(own.signals(0).utilization, 4),
        }
    return answer
