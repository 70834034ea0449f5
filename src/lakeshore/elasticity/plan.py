"""The plan: one step per queue or pool, from a snapshot, with no I/O.

``plan(snapshot, now)`` is where every elasticity answer is made — the controller's
tick carries its steps out, ``stats`` and ``explain`` show one scope's step, and the
simulator runs it on a virtual clock. A step holds the signals the rules read, the
policy, the decision (with its reason, rule and hint), and what carrying it out takes:
the victim of a scale-down, the launch of a scale-up, or the downgrade to a no-op the
plan already knows of (no provider to launch through, no idle worker to kill).

Two cases the plan cannot finish alone, each finished by a pure call once the caller
(which may do I/O) has what it lacks: a queue with a custom scaler comes back with
:attr:`Step.scaler` set — the caller asks the scaler and hands the answer to
:func:`answer`; and a scale-down of a queue whose snapshot held only its worker count
comes back with :attr:`Step.needs_workers` — the caller reads those workers and hands
them to :func:`with_workers`, which picks the victim by the same rule.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Final

from lakeshore.domain import custom_scaler, fleet, scaling, wait_target
from lakeshore.domain.queue import DaemonTemplate
from lakeshore.domain.scaling import Counters, Decision, Policy, Signals
from lakeshore.elasticity import estimates
from lakeshore.elasticity.snapshot import Key, Snapshot
from lakeshore.elasticity.units import Unit, distinct_workers, provider_of, tally, units_of

NO_IDLE_WORKER: Final = "no idle worker to kill (busy workers are never killed)"
AWAITING_SCALER: Final = "custom_scaler.awaiting"
NUDGED_KINDS: Final = (
    "fully_elastic",
    "max_count",
    "wait_target",
)  # hysteresis policies are left alone


@dataclass(frozen=True)
class Launch:
    """A daemon to launch: through which provider, from which template, joining which
    queues."""

    provider: str
    template: DaemonTemplate | None
    membership: list[str]
    count: int = 1  # as many daemons as the decision launches (``max_step`` at most)


@dataclass(frozen=True)
class Step:
    """One queue's or pool's part of a plan."""

    unit: Unit
    signals: Signals
    policy: Policy
    decision: Decision
    counters: Counters  # the counters this step found (``decision.counters`` are next)
    victims: tuple[str, ...] = ()  # the workers a scale-down kills
    launch: Launch | None = None  # the daemons a scale-up launches
    scaler: str | None = None  # a custom scaler's path, while its answer is awaited
    needs_workers: bool = False  # a scale-down whose victim waits on its workers' rows
    demand: wait_target.Demand | None = None  # what a wait_target step decided from

    @property
    def key(self) -> Key:
        return self.unit.key

    @property
    def victim(self) -> str | None:
        """The first (or only) worker a scale-down kills."""
        return self.victims[0] if self.victims else None

    @property
    def action(self) -> str:
        return self.decision.action

    def before(self) -> dict[str, Any]:
        return signals_json(self.signals)

    def downgraded(self, failure: str) -> Step:
        """This step as a no-op, ``failure`` appended to its reason (nothing to carry out)."""
        return replace(
            self, decision=scaling.downgrade(self.decision, failure), victims=(), launch=None
        )


def plan(
    snapshot: Snapshot,
    now: datetime,
    *,
    only: Collection[Key] | None = None,
    previous: Mapping[Key, Step] | None = None,
) -> list[Step]:
    """One step per active queue or pool of ``snapshot`` (only the scopes in ``only``,
    when given), in tick order: standalone queues, then pools, per namespace.

    ``now`` is the instant the snapshot was read; the rules of today read no clock, but
    the plan is dated by it, as the tick that carries it out is. ``previous`` (the last
    plan's steps, by scope) lets a scope whose queues, signals and counters are all as
    they were keep its decision rather than compute it again: the rules are a function
    of those alone, so the answer is the same."""
    del now  # the rules are clock-free; the parameter dates the plan for its callers
    steps = []
    for unit in units_of(snapshot):
        if only is not None and unit.key not in only:
            continue
        steps.append(step_of(unit, snapshot, (previous or {}).get(unit.key)))
    return steps


def step_of(unit: Unit, snapshot: Snapshot, previous: Step | None = None) -> Step:
    counted = tally(unit.members, snapshot)
    s = counted.signals(snapshot.in_flight.get(unit.key, 0))
    kept = snapshot.counters.get(unit.key, Counters())
    if previous is not None and _same_inputs(previous, unit, s, kept):
        return replace(previous, unit=unit)
    spec = unit.policy_queue.spec
    policy = scaling.Policy.from_spec(spec)
    if spec.custom_scaler_udf is not None:
        waiting = Decision("tick_noop", "custom scaler not asked yet", Counters(), AWAITING_SCALER)
        return Step(unit, s, policy, waiting, kept, scaler=spec.custom_scaler_udf)
    if policy.kind == "wait_target":
        history = snapshot.history.get(unit.key, estimates.History())
        demand = estimates.demand(policy, history)
        decided = wait_target.decide(policy, s, demand)
        return _settle(Step(unit, s, policy, decided, kept, demand=demand), counted.workers)
    return _settle(Step(unit, s, policy, scaling.decide(policy, s, kept), kept), counted.workers)


def _same_inputs(previous: Step, unit: Unit, s: Signals, counters: Counters) -> bool:
    """Whether a scope's last step was decided from what it reads now: the same parsed
    queues (a cached queue is the same object until its revision moves), signals and
    counters, and no custom scaler (whose answer may change whatever it reads). Only a
    no-op rule is kept: a scale rule's step depends on more (the workers a victim is
    picked from), so it is decided again."""
    before = previous.unit
    rule = previous.decision.rule
    return (
        previous.scaler is None
        and previous.demand is None  # wait_target reads its history too
        and not rule.endswith(("scale_up", "scale_down", "below_min", "headroom"))
        and previous.decision.rule != AWAITING_SCALER
        and before.launch_from is unit.launch_from
        and len(before.members) == len(unit.members)
        and all(a is b for a, b in zip(before.members, unit.members, strict=True))
        and unit.policy_queue.spec.custom_scaler_udf is None
        and previous.signals == s
        and previous.counters == counters
    )


def answer(step: Step, snapshot: Snapshot, reply: object, *, failure: str | None = None) -> Step:
    """Settle a step that waited on its custom scaler: ``reply`` is what the scaler
    returned, ``failure`` what went wrong when it raised or did not answer in time."""
    if failure is not None:
        decision = custom_scaler.scaler_failed(failure)
    else:
        decision = custom_scaler.interpret_scaler_answer(reply, step.policy, step.signals)
    settled = replace(step, decision=decision, scaler=None)
    return _settle(settled, tally(step.unit.members, snapshot).workers)


def with_workers(
    steps: Sequence[Step], workers: Mapping[str, Sequence[fleet.WorkerView]]
) -> list[Step]:
    """Settle the steps that need workers (:attr:`Step.needs_workers`) with ``workers``
    (queue id → its subscribed workers, retiring ones left out): their victims."""
    settled = []
    for step in steps:
        if step.needs_workers:
            found = distinct_workers(step.unit.members, workers)
            step = _settle(replace(step, needs_workers=False), found)
        settled.append(step)
    return settled


def _settle(step: Step, workers: Sequence[fleet.WorkerView] | None) -> Step:
    """What carrying out the decision takes: a launch's provider, a kill's victim — or,
    when there is none, the decision downgraded to a no-op saying why."""
    unit = step.unit
    if step.action == "scale_up":
        name = provider_of(unit)
        if name is None:
            return step.downgraded(scaling.no_provider_reason(unit.launch_from.name))
        template = unit.launch_from.spec.daemon_template
        body = Launch(name, template, unit.membership, step.decision.count)
        return replace(step, launch=body)
    if step.action == "scale_down":
        if workers is None:  # only their number is known: the caller reads them
            return replace(step, needs_workers=True)
        if step.demand is not None:  # wait_target: only those idle for longer than a boot
            boot_s, idle = step.demand.boot.value, step.demand.idle_for
            workers = [w for w in workers if idle.get(w.id, 0.0) > boot_s]
        victims = fleet.victim_order(workers)[: step.decision.count]
        if not victims:
            return step.downgraded(NO_IDLE_WORKER)
        if len(victims) < step.decision.count:  # fewer idle than decided: those there are
            fewer = replace(step.decision, count=len(victims))
            step = replace(step, decision=fewer)
        return replace(step, victims=tuple(v.id for v in victims))
    return step


def estimates_json(step: Step) -> dict[str, Any] | None:
    """What a ``wait_target`` decision was computed from, for its audit row."""
    return dict(step.decision.estimates) if step.decision.estimates is not None else None


def signals_json(s: Signals) -> dict[str, Any]:
    return {
        "daemon_count": s.daemon_count,
        "utilization": round(s.utilization, 4),
        "pending": s.pending,
        "in_flight": s.in_flight,
    }


def changed_counters(steps: Sequence[Step]) -> dict[Key, Counters]:
    """The counters a plan's decisions change (whatever their launches or kills become)."""
    return {s.key: s.decision.counters for s in steps if s.counters != s.decision.counters}


def at_zero(steps: Sequence[Step]) -> dict[str, Key]:
    """The queues of the scopes a plan leaves at zero, each with its scope: no daemon,
    nothing in flight, nothing pending, a target policy without a custom scaler, and a
    no-op decided (a first submit to one of them is planned at once)."""
    zero: dict[str, Key] = {}
    for step in steps:
        s, spec = step.signals, step.unit.policy_queue.spec
        if step.action != "tick_noop" or spec.custom_scaler_udf is not None:
            continue
        if step.policy.kind in NUDGED_KINDS and s.daemon_count == s.in_flight == s.pending == 0:
            for queue in step.unit.members:
                zero[queue.id] = step.key
    return zero
