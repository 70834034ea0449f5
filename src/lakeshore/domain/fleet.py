"""The fleet side of a scaling decision: whom to kill, which queues tick together, what to launch.

Scale-down (``spec/scaling-rules.txt``): only idle workers are candidates, the most
expensive first (``capabilities.cost_weight``; else 10 for a worker with any ``gpu:*``
tag; else 1), then the one seen longest ago; the id breaks any remaining tie so the choice
is deterministic. At most one victim per queue or pool per tick.

Pools: active queues carrying the same ``elasticity.pool`` tick as one unit. Their pending
counts are summed, their workers de-duplicated by id, the policy is the first member's
(members ordered by creation, then name), a launch joins every member queue, and the
audit row is written under ``pool:<name>``.

Scale-up: the launch body comes from the queue's ``daemonTemplate``; the provider is
``providerRef``, else ``daemonTemplate.provider``. Everything here is arithmetic on
values; the controller reads the store and calls providers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final

from lakeshore.domain.queue import DaemonTemplate, Elasticity, Queue, QueueSpec
from lakeshore.domain.scaling import Policy

GPU_TAG_PREFIX: Final = "gpu:"
GPU_COST_WEIGHT: Final = 10.0
DEFAULT_COST_WEIGHT: Final = 1.0
DEFAULT_RUNNERS: Final = ("process",)
DEFAULT_CAPACITY: Final = 1
DEFAULT_QUEUE: Final = "default"


# --- scale-down: the victim ------------------------------------------------------------


@dataclass(frozen=True)
class WorkerView:
    """What scale-down needs to know about a worker.

    ``cost_weight`` and ``current_invocations`` are the daemon's own capability reports
    (``None`` when it does not send them); ``running`` is the server's count of the
    worker's running leases.
    """

    id: str
    tags: tuple[str, ...]
    cost_weight: float | None
    current_invocations: int | None
    running: int
    last_seen_at: datetime


def is_idle(worker: WorkerView) -> bool:
    """Whether ``worker`` may be killed.

    The spec reads ``capabilities.current_invocations == 0`` and, only when the daemon
    does not report it, zero running invocations. We trust the server's own count of
    running leases as well (a daemon's report can be stale or absent): a worker is idle
    only when it holds no running lease *and* does not report any invocation in progress.
    Busy workers are never killed.
    """
    return worker.running == 0 and not worker.current_invocations


def cost_weight(worker: WorkerView) -> float:
    """The reported ``cost_weight``; else 10 for any ``gpu:*`` tag; else 1."""
    if worker.cost_weight is not None:
        return worker.cost_weight
    if any(tag.startswith(GPU_TAG_PREFIX) for tag in worker.tags):
        return GPU_COST_WEIGHT
    return DEFAULT_COST_WEIGHT


def victim_order(workers: Iterable[WorkerView]) -> list[WorkerView]:
    """The idle workers, best victim first: costliest, then oldest ``lastSeenAt``, then id."""
    idle = (w for w in workers if is_idle(w))
    return sorted(idle, key=lambda w: (-cost_weight(w), w.last_seen_at, w.id))


def pick_victim(workers: Iterable[WorkerView]) -> WorkerView | None:
    """The one worker to kill this tick, or ``None`` when every worker is busy."""
    order = victim_order(workers)
    return order[0] if order else None


# --- pools ------------------------------------------------------------------------------


@dataclass(frozen=True)
class QueueView:
    """An active queue as the controller groups it: its id, spec and creation time."""

    id: str
    spec: QueueSpec
    created_at: datetime

    @classmethod
    def from_queue(cls, queue: Queue) -> QueueView:
        return cls(id=queue.id, spec=queue.spec, created_at=queue.created_at)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def elasticity(self) -> Elasticity | None:
        return self.spec.elasticity

    @property
    def pool(self) -> str | None:
        return self.spec.elasticity.pool if self.spec.elasticity else None

    @property
    def policy(self) -> Policy:
        return Policy.from_spec(self.spec)


def partition(queues: Iterable[QueueView]) -> tuple[list[QueueView], dict[str, list[QueueView]]]:
    """Standalone queues (in input order) and pools (by pool name, sorted).

    A pool's members are ordered by ``created_at``, then name; ``members[0]`` is the "first
    member queue" whose policy the pool follows.
    """
    standalone: list[QueueView] = []
    pools: dict[str, list[QueueView]] = {}
    for queue in queues:
        if queue.pool is None:
            standalone.append(queue)
        else:
            pools.setdefault(queue.pool, []).append(queue)
    ordered = {
        name: sorted(members, key=lambda q: (q.created_at, q.name))
        for name, members in sorted(pools.items())
    }
    return standalone, ordered


def pool_audit_name(pool: str) -> str:
    """The ``queueName`` of a pool's audit rows."""
    return f"pool:{pool}"


def pool_policy(members: Sequence[QueueView]) -> Policy:
    """The policy a pool follows: its first member's."""
    if not members:
        raise ValueError("a pool has at least one member queue")
    return members[0].policy


def pool_disagreements(members: Sequence[QueueView]) -> list[str]:
    """One line per member whose ``kind`` / ``min`` / ``max`` differ from the first member's.

    All members should declare the same; when they do not, the first member wins, and
    these lines let ``explain`` say so.
    """
    if not members:
        return []
    first = members[0]
    wanted = _shape(first.policy)
    return [
        f'queue "{m.name}" declares {_shape(m.policy)}; the pool follows "{first.name}" ({wanted})'
        for m in members[1:]
        if _shape(m.policy) != wanted
    ]


def _shape(policy: Policy) -> str:
    return f"kind={policy.kind} min={policy.min} max={policy.max}"


def aggregate(
    pending_by_queue: Mapping[str, int],
    workers_by_queue: Mapping[str, Sequence[WorkerView]],
    members: Sequence[QueueView],
) -> tuple[int, list[WorkerView]]:
    """A pool's pending count (summed over members) and its workers (de-duplicated by id).

    Both maps are keyed by queue name; a member missing from one counts as empty. A worker
    subscribed to several members is counted once, in the order first met.
    """
    pending = sum(pending_by_queue.get(m.name, 0) for m in members)
    seen: dict[str, WorkerView] = {}
    for member in members:
        for worker in workers_by_queue.get(member.name, ()):
            seen.setdefault(worker.id, worker)
    return pending, list(seen.values())


# --- scale-up: what to launch and where --------------------------------------------------


@dataclass(frozen=True)
class LaunchBody:
    """What a provider is asked to start: one daemon, its queues and its template."""

    queues: tuple[str, ...]
    runners: tuple[str, ...] = DEFAULT_RUNNERS
    capacity: int = DEFAULT_CAPACITY
    cloud_tags: dict[str, str] = field(default_factory=dict)
    bootstrap_script: str | None = None
    setup_commands: tuple[str, ...] = ()
    instance_type: str | None = None
    image_id: str | None = None


def launch_body(template: DaemonTemplate | None, membership: Sequence[str]) -> LaunchBody:
    """The launch for ``template`` joining ``membership``.

    Runners are ``runners`` when non-empty, else ``[runner]``, else ``["process"]``;
    capacity defaults to 1; ``setup_scripts`` become setup commands, in order.
    """
    queues = tuple(membership)
    if template is None:
        return LaunchBody(queues=queues)
    return LaunchBody(
        queues=queues,
        runners=template_runners(template),
        capacity=template.capacity if template.capacity is not None else DEFAULT_CAPACITY,
        cloud_tags=dict(template.cloud_tags or {}),
        bootstrap_script=template.bootstrap_script,
        setup_commands=tuple(template.setup_scripts or ()),
        instance_type=template.instance_type,
        image_id=template.image_id,
    )


def template_runners(template: DaemonTemplate) -> tuple[str, ...]:
    """The runners a launched daemon is asked for (``runners``, else ``runner``, else
    ``process``)."""
    if template.runners:
        return tuple(template.runners)
    if template.runner:
        return (template.runner,)
    return DEFAULT_RUNNERS


def membership(queue_name: str) -> list[str]:
    """A launched daemon's queues for one queue: ``[name]``, or ``[]`` for the default queue."""
    return [] if queue_name == DEFAULT_QUEUE else [queue_name]


def pool_membership(members: Sequence[QueueView]) -> list[str]:
    """A launched daemon's queues for a pool: every member queue, in member order."""
    return [m.name for m in members]


def provider_name(spec: QueueSpec) -> str | None:
    """``providerRef``, else ``daemonTemplate.provider``, else ``None`` (cannot launch)."""
    if spec.provider_ref is not None:
        return spec.provider_ref
    if spec.daemon_template is not None:
        return spec.daemon_template.provider
    return None


def pool_launch_source(members: Sequence[QueueView]) -> QueueView:
    """The member whose provider and template a pool's launch uses.

    The spec says only that policy comes from the first member. We take the first member
    (in member order) that names a provider, so one member without a provider does not
    stop the pool; when none does, the first member (and its no-provider reason).
    """
    if not members:
        raise ValueError("a pool has at least one member queue")
    return next((m for m in members if provider_name(m.spec) is not None), members[0])
