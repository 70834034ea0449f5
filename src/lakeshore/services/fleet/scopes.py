"""One queue's scope — the queue itself, or its pool — read as a tick reads it.

``stats`` and ``explain`` answer with the signals the controller acts on, so they are
computed here by the controller's own code: the same store reads
(:func:`lakeshore.store.controller.snapshot_of`, restricted to the scope's queues), the
same plan (:func:`lakeshore.elasticity.plan.plan`, for this one scope), with launches
in flight counted as the tick counts them (unexpired only). Retiring workers are not
counted, as the controller does not count them. The reading's step is the decision the
next tick would take if nothing changed before it.

For a queue in a pool the scope is the pool's active members (the queue itself too when
it is not active, for its own counts); :attr:`Reading.own` holds the queue's own counts
beside the pool's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from lakeshore.domain.queue import Queue
from lakeshore.domain.scaling import Counters, Signals
from lakeshore.elasticity import plan, units
from lakeshore.services.namespaces import Namespace
from lakeshore.store import controller as ctl_store
from lakeshore.store import queues as queue_store
from lakeshore.store.engine import Store


@dataclass(frozen=True)
class Reading:
    step: plan.Step  # what the plan says of the scope now: its signals, policy, decision
    own: units.Tally  # the queue's own counts (the scope's, for a lone queue)

    @property
    def scope(self) -> str:  # the queue's name, or "pool:<name>"
        return self.step.unit.scope

    @property
    def members(self) -> list[str]:  # the queues that tick together
        return [q.name for q in self.step.unit.members]

    @property
    def signals(self) -> Signals:
        return self.step.signals

    @property
    def counters(self) -> Counters:  # the scope's hysteresis counters, as stored
        return self.step.counters


scope_of = units.scope_of  # what the controller ticks a queue as: itself, or its pool


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
        snap = await ctl_store.snapshot_of(
            conn, ns.id, [(ns.name, q) for q in read_for], scope, now
        )
    ticking = replace(snap, queues=[(ns.name, q) for q in members])
    (step,) = plan.plan(ticking, now, only={(ns.id, scope)})
    return Reading(step=step, own=units.tally([queue], snap))
