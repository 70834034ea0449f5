"""What the controller ticks: a standalone queue or a pool, with its signals.

Active queues are grouped per namespace: standalone queues first (in creation order),
then pools (by name), each pool ticking as one unit whose pending is summed over its
members, whose workers are de-duplicated by id, whose policy is its first member's, and
whose launches join every member queue.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lakeshore.domain import fleet, signals
from lakeshore.domain.queue import Queue
from lakeshore.domain.scaling import Decision, Signals
from lakeshore.store import controller as ctl_store


@dataclass
class Unit:
    """One thing that ticks: a standalone queue, or a pool of queues."""

    namespace_id: str
    namespace: str
    scope: str  # the queue's name, or "pool:<name>"
    members: list[Queue]
    launch_from: Queue  # whose provider and daemon template a launch uses
    membership: list[str]
    workers: list[fleet.WorkerView] = field(default_factory=list)
    signals: Signals | None = None

    @property
    def policy_queue(self) -> Queue:
        return self.members[0]


@dataclass
class Outcome:
    unit: Unit
    decision: Decision
    after: dict[str, Any]
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "namespace": self.unit.namespace,
            "queueName": self.unit.scope,  # the spec's name: a queue's, or "pool:<name>"
            "scope": self.unit.scope,  # the same, as earlier servers named it
            "action": self.decision.action,
            "reason": self.decision.reason,
            "rule": self.decision.rule,
            "before": signals_json(self.unit.signals),
            "after": self.after,
            "hint": self.decision.hint,
            **self.detail,
        }


def signals_json(s: Signals | None) -> dict[str, Any]:
    if s is None:
        return {}
    return {
        "daemon_count": s.daemon_count,
        "utilization": round(s.utilization, 4),
        "pending": s.pending,
        "in_flight": s.in_flight,
    }


def units_of(snapshot: ctl_store.Snapshot) -> list[Unit]:
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
    left out), pending and running summed over its members, and the workers' capacity."""

    workers: list[fleet.WorkerView]
    pending: int
    running: int
    capacity: int

    def signals(self, in_flight: int) -> Signals:
        return Signals(
            daemon_count=len(self.workers),
            utilization=signals.utilization(
                running=self.running, capacity=self.capacity, pending=self.pending
            ),
            pending=self.pending,
            in_flight=in_flight,
            capacity=self.capacity,
            running=self.running,
        )


def tally(members: list[Queue], snapshot: ctl_store.Snapshot) -> Tally:
    seen: dict[str, fleet.WorkerView] = {}
    for queue in members:
        for worker in snapshot.workers.get(queue.id, ()):
            seen.setdefault(worker.id, worker)
    return Tally(
        workers=list(seen.values()),
        pending=sum(snapshot.pending.get(q.id, 0) for q in members),
        running=sum(snapshot.running.get(q.id, 0) for q in members),
        capacity=sum(snapshot.capacity.get(w, 0) for w in seen),
    )


def gather_signals(unit: Unit, snapshot: ctl_store.Snapshot, in_flight: int) -> Signals:
    """Pending summed over members, workers de-duplicated, utilization from running leases."""
    counted = tally(unit.members, snapshot)
    unit.workers = counted.workers
    return counted.signals(in_flight)


def provider_of(unit: Unit) -> str | None:
    """The provider a unit launches through (``providerRef``, else the template's)."""
    return fleet.provider_name(unit.launch_from.spec)
