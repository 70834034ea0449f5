"""What the controller ticks: a standalone queue or a pool, and the counts of each.

Active queues are grouped per namespace: standalone queues first (in creation order),
then pools (by name), each pool ticking as one unit whose pending is summed over its
members, whose workers are de-duplicated by id, whose policy is its first member's, and
whose launches join every member queue.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from lakeshore.domain import fleet, signals
from lakeshore.domain.queue import Queue
from lakeshore.domain.scaling import Signals
from lakeshore.elasticity.snapshot import Key, Snapshot


@dataclass(frozen=True)
class Unit:
    """One thing that ticks: a standalone queue, or a pool of queues."""

    namespace_id: str
    namespace: str
    scope: str  # the queue's name, or "pool:<name>"
    members: list[Queue]
    launch_from: Queue  # whose provider and daemon template a launch uses
    membership: list[str]

    @property
    def policy_queue(self) -> Queue:
        """The queue whose policy the unit follows (a pool's first member)."""
        return self.members[0]

    @property
    def key(self) -> Key:
        return (self.namespace_id, self.scope)


def scope_of(queue: Queue) -> str:
    """What the controller ticks this queue as: itself, or its pool."""
    pool = queue.spec.elasticity.pool if queue.spec.elasticity else None
    return fleet.pool_audit_name(pool) if pool else queue.name


def units_of(snapshot: Snapshot) -> list[Unit]:
    """Standalone queues first, then pools (per namespace, pools by name)."""
    by_ns: dict[str, list[Queue]] = {}
    names: dict[str, str] = {}
    for ns_name, queue in snapshot.queues:
        by_ns.setdefault(queue.namespace_id, []).append(queue)
        names[queue.namespace_id] = ns_name
    standalone: list[Unit] = []
    pooled: list[Unit] = []
    for ns_id, members in by_ns.items():
        views = {q.id: q for q in members}
        alone, pools = fleet.partition(fleet.QueueView.from_queue(q) for q in members)
        for view in alone:
            queue = views[view.id]
            standalone.append(
                Unit(ns_id, names[ns_id], queue.name, [queue], queue, fleet.membership(queue.name))
            )
        for pool, pool_members in pools.items():
            queues = [views[m.id] for m in pool_members]
            source = views[fleet.pool_launch_source(pool_members).id]
            pooled.append(
                Unit(
                    ns_id,
                    names[ns_id],
                    fleet.pool_audit_name(pool),
                    queues,
                    source,
                    fleet.pool_membership(pool_members),
                )
            )
    return standalone + pooled


@dataclass(frozen=True)
class Tally:
    """What a unit's signals are computed from: its workers (de-duplicated, retiring ones
    left out; ``None`` when only their number was read), pending and running summed over
    its members, and the workers' capacity."""

    workers: list[fleet.WorkerView] | None
    daemons: int
    pending: int
    running: int
    capacity: int

    def signals(self, in_flight: int) -> Signals:
        return Signals(
            daemon_count=self.daemons,
            utilization=signals.utilization(
                running=self.running, capacity=self.capacity, pending=self.pending
            ),
            pending=self.pending,
            in_flight=in_flight,
            capacity=self.capacity,
            running=self.running,
        )


def tally(members: Sequence[Queue], snapshot: Snapshot) -> Tally:
    if len(members) == 1:  # a lone queue: its workers are distinct already
        queue = members[0]
        counted = snapshot.headcount.get(queue.id)
        if counted is not None and queue.id not in snapshot.workers:
            return Tally(
                workers=None,
                daemons=counted[0],
                pending=snapshot.pending.get(queue.id, 0),
                running=snapshot.running.get(queue.id, 0),
                capacity=counted[1],
            )
        workers = list(snapshot.workers.get(queue.id, ()))
        return Tally(
            workers=workers,
            daemons=len(workers),
            pending=snapshot.pending.get(queue.id, 0),
            running=snapshot.running.get(queue.id, 0),
            capacity=sum(snapshot.capacity.get(w.id, 0) for w in workers),
        )
    workers = distinct_workers(members, snapshot.workers)
    return Tally(
        workers=workers,
        daemons=len(workers),
        pending=sum(snapshot.pending.get(q.id, 0) for q in members),
        running=sum(snapshot.running.get(q.id, 0) for q in members),
        capacity=sum(snapshot.capacity.get(w.id, 0) for w in workers),
    )


def distinct_workers(
    members: Sequence[Queue], workers: Mapping[str, Sequence[fleet.WorkerView]]
) -> list[fleet.WorkerView]:
    """The workers of ``members`` (queue id → its workers), each once: a worker that
    serves two members of a pool counts once."""
    seen: dict[str, fleet.WorkerView] = {}
    for queue in members:
        for worker in workers.get(queue.id, ()):
            seen.setdefault(worker.id, worker)
    return list(seen.values())


def provider_of(unit: Unit) -> str | None:
    """The provider a unit launches through (``providerRef``, else the template's)."""
    return fleet.provider_name(unit.launch_from.spec)
