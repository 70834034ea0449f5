"""What a plan is computed from: one consistent read of the queues and their fleets.

A queue's fleet comes either as its workers (``workers``: what stats, explain, the
simulator and a pool's members read) or, for the controller's tick of a standalone queue,
as two numbers (``headcount``): 50,000 worker rows cost a 10,000-queue tick more than
everything else it read, and only a scale-down needs them, for its victim."""

from __future__ import annotations

from dataclasses import dataclass, field

from lakeshore.domain.fleet import WorkerView
from lakeshore.domain.queue import Queue
from lakeshore.domain.scaling import Counters
from lakeshore.elasticity.estimates import History

Key = tuple[str, str]  # (namespace id, scope): a queue's name, or "pool:<name>"


@dataclass(frozen=True)
class Snapshot:
    queues: list[tuple[str, Queue]]  # (namespace name, queue), active ones, in tick order
    pending: dict[str, int]  # queue id → pending
    running: dict[str, int]  # queue id → running leases
    workers: dict[str, list[WorkerView]]  # queue id → subscribed workers (not retiring)
    capacity: dict[str, int]  # worker id → max invocations
    counters: dict[Key, Counters]  # (namespace id, scope) → hysteresis counters
    in_flight: dict[Key, int] = field(default_factory=dict)  # unexpired launches per scope
    # queue id → (daemons, their capacity), for a standalone queue whose workers are not
    # listed in ``workers``: its signals are counted from these, and only a step that
    # needs a victim has its workers read (see ``Step.needs_workers``)
    headcount: dict[str, tuple[int, int]] = field(default_factory=dict)
    # (namespace id, scope) → its recent history, for the scopes whose policy learns from
    # it (wait_target); a scope left out learns nothing yet (hints and defaults)
    history: dict[Key, History] = field(default_factory=dict)
