"""One queue's scope — the queue itself, or its pool — read as a tick reads it.

``stats`` and ``explain`` answer with the signals the controller acts on, so they are
computed here by the controller's own code: the same store reads
(:func:`lakeshore.store.controller.snapshot_of`, restricted to the scope's queues), the
same grouping (:func:`.units.units_of`) and the same sums (:func:`.units.tally`), with
launches in flight counted as the tick counts them (unexpired only). Retiring workers
are not counted, as the controller does not count them.

For a queue in a pool the scope is the pool's active members (the queue itself too when
it is not active, for its own counts); :attr:`Reading.own` holds the queue's own counts
beside the pool's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from lakeshore.domain.queue import Queue
from lakeshore.domain.scaling import Counters, Signals
from lakeshore.services import units
from lakeshore.services.namespaces import Namespace
from lakeshore.store import controller as ctl_store
from lakeshore.store import launches as launch_store
from lakeshore.store import queues as queue_store
from lakeshore.store.engine import Store


@dataclass(frozen=True)
class Reading:
    scope: str  # the queue's name, or "pool:<name>"
    members: list[str]  # the queues that tick together (the queue alone, or the pool's)
    tally: units.Tally  # the scope's counts
    signals: Signals  # what the controller's rules read
    counters: Counters  # the scope's hysteresis counters
    own: units.Tally  # the queue's own counts (the same as ``tally`` for a lone queue)


def scope_of(queue: Queue) -> str:
    """What the controller ticks this queue as: itself, or its pool."""
    pool = queue.spec.elasticity.pool if queue.spec.elasticity else None
    return f"pool:{pool}" if pool else queue.name


async def read(store: Store, ns: Namespace, queue: Queue, now: datetime) -> Reading:
    pool = queue.spec.elasticity.pool if queue.spec.elasticity else None
    scope = scope_of(queue)
    async with store.read() as conn:
        members = [queue]
        if pool is not None:
            listed = await queue_store.list_queues(conn, ns.id)
            active = [
                q
                for q in listed
                if q.state == "active" and q.spec.elasticity and q.spec.elasticity.pool == pool
            ]
            members = active or [queue]
        read_for = members if any(q.id == queue.id for q in members) else [*members, queue]
        snap = await ctl_store.snapshot_of(conn, ns.id, [(ns.name, q) for q in read_for])
        in_flight = await launch_store.in_flight_by_scope(conn, [(ns.id, scope)], now)
    ticking = replace(snap, queues=[(ns.name, q) for q in members])
    unit = next(u for u in units.units_of(ticking) if u.scope == scope)
    counted = units.tally(unit.members, snap)
    return Reading(
        scope=scope,
        members=[q.name for q in unit.members],
        tally=counted,
        signals=counted.signals(in_flight[(ns.id, scope)]),
        counters=snap.counters.get((ns.id, scope), Counters()),
        own=units.tally([queue], snap),
    )
