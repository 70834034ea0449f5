"""What would this policy have done? The production plan on a virtual clock.

:func:`simulate` plays a workload (submit times and run times) against one queue spec: a
discrete-event model of the fleet (launches that boot after a delay, daemons with a
number of slots, invocations served first come first served by the first free slot)
and, every ``interval_s``, the controller's own :func:`~lakeshore.elasticity.plan.plan`
on a snapshot of that model — the same code the server's tick runs, not a copy of its
rules. Nothing here reads a clock or does I/O: a day of 5-second ticks takes seconds,
and the same inputs (and seed) give the same report.

What the model leaves out, on purpose: claim and heartbeat latency (a free slot takes
the next invocation at once), launches that never boot (every launch boots after its
delay), retries and failures, and custom scalers (a queue with ``customScalerUdf`` is
refused: its answers are the user's code, not the plan's).
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from lakeshore.domain.fleet import WorkerView
from lakeshore.domain.fleet import provider_name as fleet_of
from lakeshore.domain.queue import Queue, QueueSpec
from lakeshore.domain.scaling import WINDOW, Counters
from lakeshore.elasticity import estimates, plan
from lakeshore.elasticity.snapshot import Snapshot
from lakeshore.elasticity.units import scope_of
from lakeshore.elasticity.workload import Dist

EPOCH: Final = datetime(2026, 1, 1, tzinfo=UTC)  # virtual time 0
NAMESPACE: Final = ("ns_sim", "sim")
RELAUNCH_S: Final = 600.0  # a launch this soon after a kill counts as a relaunch
SIM_PROVIDER: Final = "simulated"  # the provider of a spec that names none
_FINISH, _BOOT, _ARRIVE, _TICK = range(4)  # the order of events at one instant


Trace = Callable[[float, str, Any], None]
"""Hears the model's events at their virtual second, in order: ``("arrive", run_s)``,
``("boot", daemon_id)`` (the daemons of the start too, at 0), ``("dispatch", daemon_id)``
(a free slot of that daemon takes the oldest waiting invocation), ``("finish",
daemon_id)``, and ``("tick", step)`` (the plan's step, its launch or kill made)."""


def _ignore(t: float, kind: str, data: Any) -> None:
    del t, kind, data


class SimulationError(ValueError):
    """A spec the simulator cannot play (a custom scaler), with the reason."""


@dataclass(frozen=True)
class Fleet:
    """The model of the fleet a policy scales."""

    boot: Dist = field(default_factory=lambda: Dist("fixed", 30.0))  # launch → ready
    capacity: int | None = None  # slots per daemon; None: daemonTemplate.capacity, else 1
    cost_per_hour: float = 1.0  # the cost weight of one daemon-hour
    interval_s: float = 5.0  # the controller's tick interval
    initial: int | None = None  # daemons running at the start; None: the policy's min
    # the provider's configured boot_s: wait_target's boot estimate until the model's
    # first boot (as a registration's ``boot_s`` is the server's); None: none configured
    boot_s: float | None = None


@dataclass
class _Daemon:
    id: str
    slots: int
    busy: int = 0
    idle_since: float = 0.0  # when it last had nothing to run (its boot, at first)


@dataclass
class Report:
    """One policy's day: cost, waits, fleet moves, and its decisions as the feed shows
    them (identical consecutive no-ops folded, with their count)."""

    queue: str
    kind: str
    invocations: int = 0
    served: int = 0
    unfinished: int = 0
    daemon_hours: float = 0.0
    cost: float = 0.0
    wait_p50_s: float = 0.0
    wait_p95_s: float = 0.0
    wait_max_s: float = 0.0
    wait_mean_s: float = 0.0
    unserved_demand_s: float = 0.0  # pending integrated over time: invocation-seconds waited
    launches: int = 0
    kills: int = 0
    thrash: int = 0  # kills within the hysteresis window (WINDOW ticks) after a launch
    relaunches: int = 0  # launches within RELAUNCH_S of a kill: cold starts a kept daemon saves
    peak_daemons: int = 0
    ticks: int = 0
    ended_s: float = 0.0  # the virtual time the play stopped at (past the end in a drain)
    at_bound: float = 0.0  # fraction of ticks whose decision a min or max held back
    decisions: list[dict[str, Any]] = field(default_factory=list)
    timeline: list[tuple[float, int, int, int]] = field(default_factory=list)
    # (t, pending, running, daemons counting those booting), one per tick
    started: list[tuple[float, float]] = field(default_factory=list)
    # (submit second, wait seconds) of each invocation started, in start order

    def summary(self) -> dict[str, Any]:
        """Everything but the timeline, rounded for print and for byte-equal reruns."""
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            if name in ("timeline", "started"):
                continue
            value = getattr(self, name)
            out[name] = round(value, 4) if isinstance(value, float) else value
        return out


def simulate(
    spec: QueueSpec,
    work: Sequence[tuple[float, float]],
    fleet: Fleet,
    *,
    duration_s: float,
    rng: random.Random,
    drain: bool = False,
    trace: Trace | None = None,
) -> Report:
    """Play ``work`` ((submit second, run seconds), in submit order) against ``spec``'s
    policy for ``duration_s`` virtual seconds; ``rng`` draws the boot delays. With
    ``drain``, the clock runs on past ``duration_s`` (no more arrivals) until the work
    submitted is done, or for as long again at most. ``trace``, when given, hears every
    event of the model as it happens (see :data:`Trace`)."""
    if spec.custom_scaler_udf is not None:
        raise SimulationError(
            f'queue "{spec.name}" has a customScalerUdf: its decisions are its own code, '
            "which the simulator does not run"
        )
    return _World(spec, fleet, rng, trace).run(work, duration_s, drain)


class _World:
    def __init__(
        self, spec: QueueSpec, fleet: Fleet, rng: random.Random, trace: Trace | None = None
    ) -> None:
        if fleet_of(spec) is None:  # the model is the provider: every queue can launch
            spec = spec.model_copy(update={"provider_ref": SIM_PROVIDER})
        self.spec, self.fleet, self.rng = spec, fleet, rng
        template = spec.daemon_template
        self.slots = fleet.capacity or (template.capacity if template and template.capacity else 1)
        self.queue = Queue(
            id="q_sim",
            namespace_id=NAMESPACE[0],
            spec=spec,
            state="active",
            created_at=EPOCH,
            updated_at=EPOCH,
        )
        self.key = (NAMESPACE[0], scope_of(self.queue))
        self.events: list[tuple[float, int, int, Any]] = []
        self.seq = 0
        self.pending: deque[tuple[float, float]] = deque()
        self.daemons: dict[str, _Daemon] = {}
        self.booting = 0
        self.counters = Counters()
        self.made = 0
        self.waits: list[float] = []
        self.last_t = 0.0
        self.daemon_s = 0.0
        self.pending_s = 0.0
        self.last_kill: float | None = None
        self.last_launch: float | None = None
        self.report = Report(queue=spec.name, kind=_kind(spec))
        self.previous: dict[tuple[str, str], plan.Step] = {}
        self.trace: Trace = trace or _ignore
        # what wait_target learns from, as the store keeps it: finishes (when, run
        # seconds), boots (seconds), submits (when)
        self.learns = _kind(spec) == "wait_target"
        self.finished: deque[tuple[float, float]] = deque()
        self.boots: deque[float] = deque(maxlen=estimates.BOOT_SAMPLES)
        self.submits: deque[float] = deque()

    def push(self, t: float, kind: int, data: Any) -> None:
        heapq.heappush(self.events, (t, kind, self.seq, data))
        self.seq += 1

    def run(self, work: Sequence[tuple[float, float]], duration_s: float, drain: bool) -> Report:
        report = self.report
        for _ in range(self._initial()):
            self.trace(0.0, "boot", self._add_daemon())
        for submit, run_s in work:
            if submit < duration_s:
                self.push(submit, _ARRIVE, run_s)
                report.invocations += 1
        self.push(0.0, _TICK, None)
        limit = 2 * duration_s if drain else duration_s  # a drain may take as long again
        end = duration_s
        while self.events:
            t = self.events[0][0]
            if t >= limit or (t >= duration_s and not self._busy()):
                break
            _, kind, _, data = heapq.heappop(self.events)
            self._advance(t)
            self._handle(t, kind, data)
            self._dispatch(t)
            end = max(end, t)
        self._advance(end)
        report.ended_s = end
        self._finish(end)
        return report

    def _handle(self, t: float, kind: int, data: Any) -> None:
        if kind == _FINISH:
            daemon_id, run_s = data
            daemon = self.daemons[daemon_id]
            daemon.busy -= 1  # a busy daemon is never a victim
            if not daemon.busy:
                daemon.idle_since = t
            if self.learns:
                self.finished.append((t, run_s))
            self.trace(t, "finish", daemon_id)
        elif kind == _BOOT:
            self.booting -= 1
            if self.learns:
                self.boots.appendleft(t - data)
            self.trace(t, "boot", self._add_daemon(t))
        elif kind == _ARRIVE:
            self.pending.append((t, data))
            if self.learns:
                self.submits.append(t)
            self.trace(t, "arrive", data)
        else:
            self._tick(t)
            self.push(t + self.fleet.interval_s, _TICK, None)

    def _busy(self) -> bool:
        """Whether work is left: waiting, or running on a daemon."""
        return bool(self.pending) or any(d.busy for d in self.daemons.values())

    def _initial(self) -> int:
        if self.fleet.initial is not None:
            return self.fleet.initial
        elasticity = self.spec.elasticity
        return (elasticity.min or 0) if elasticity else 0

    def _finish(self, duration_s: float) -> None:
        report = self.report
        running = sum(d.busy for d in self.daemons.values())
        report.served = len(self.waits)
        report.unfinished = len(self.pending) + running
        report.daemon_hours = self.daemon_s / 3_600
        report.cost = report.daemon_hours * self.fleet.cost_per_hour
        report.unserved_demand_s = self.pending_s
        if self.waits:
            ordered = sorted(self.waits)
            report.wait_p50_s = _rank(ordered, 0.50)
            report.wait_p95_s = _rank(ordered, 0.95)
            report.wait_max_s = ordered[-1]
            report.wait_mean_s = math.fsum(ordered) / len(ordered)
        report.at_bound = report.at_bound / report.ticks if report.ticks else 0.0

    def _advance(self, t: float) -> None:
        """Integrate the fleet (booting daemons cost too) and the waiting work up to t."""
        span = t - self.last_t
        if span > 0:
            self.daemon_s += span * (len(self.daemons) + self.booting)
            self.pending_s += span * len(self.pending)
            self.last_t = t

    def _add_daemon(self, t: float = 0.0) -> str:
        self.made += 1
        daemon = _Daemon(f"d{self.made:06d}", self.slots, idle_since=t)
        self.daemons[daemon.id] = daemon
        self.report.peak_daemons = max(self.report.peak_daemons, len(self.daemons))
        return daemon.id

    def _dispatch(self, t: float) -> None:
        """Free slots take waiting invocations, first come first served."""
        if not self.pending:
            return
        for daemon in self.daemons.values():
            while daemon.busy < daemon.slots and self.pending:
                submitted, run_s = self.pending.popleft()
                self.waits.append(t - submitted)
                self.report.started.append((submitted, t - submitted))
                daemon.busy += 1
                self.push(t + run_s, _FINISH, (daemon.id, run_s))
                self.trace(t, "dispatch", daemon.id)
            if not self.pending:
                return

    def snapshot(self, t: float) -> Snapshot:
        """The model as a tick reads the store: one active queue, its daemons as
        workers (each heard from now), pending, running, launches booting, counters."""
        now = EPOCH + timedelta(seconds=t)
        workers = [
            WorkerView(
                id=d.id,
                tags=(),
                cost_weight=None,
                current_invocations=d.busy,
                running=d.busy,
                last_seen_at=now,
            )
            for d in self.daemons.values()
        ]
        return Snapshot(
            queues=[(NAMESPACE[1], self.queue)],
            pending={self.queue.id: len(self.pending)},
            running={self.queue.id: sum(d.busy for d in self.daemons.values())},
            workers={self.queue.id: workers},
            capacity={d.id: d.slots for d in self.daemons.values()},
            counters={self.key: self.counters},
            in_flight={self.key: self.booting},
            history={self.key: self.history(t)} if self.learns else {},
        )

    def history(self, t: float) -> estimates.History:
        """What the store would read of the model at ``t`` (see
        :mod:`lakeshore.elasticity.estimates`): the same windows and counts."""
        while self.finished and self.finished[0][0] < t - estimates.SERVICE_WINDOW_S:
            self.finished.popleft()
        horizon = estimates.ARRIVAL_MINUTES * 60.0
        while self.submits and self.submits[0] < t - horizon:
            self.submits.popleft()
        per_minute = [0] * estimates.ARRIVAL_MINUTES
        for at in self.submits:
            back = int((t - at) // 60.0)
            if 0 <= back < estimates.ARRIVAL_MINUTES:
                per_minute[back] += 1
        recent = list(self.finished)[-estimates.SERVICE_SAMPLES :]
        return estimates.History(
            service_s=[run_s for _, run_s in reversed(recent)],
            boot_s=list(self.boots),
            per_minute=per_minute,
            idle_for={d.id: t - d.idle_since for d in self.daemons.values() if not d.busy},
            provider_boot_s=self.fleet.boot_s,
        )

    def _tick(self, t: float) -> None:
        report = self.report
        (step,) = plan.plan(self.snapshot(t), EPOCH + timedelta(seconds=t), previous=self.previous)
        self.previous = {step.key: step}
        decision = step.decision
        self.counters = decision.counters
        report.ticks += 1
        if decision.blocked_by is not None:
            report.at_bound += 1
        if step.launch is not None:
            count = step.launch.count
            report.launches += count
            if self.last_kill is not None and t - self.last_kill <= RELAUNCH_S:
                report.relaunches += count
            self.last_launch = t
            self.booting += count
            for _ in range(count):
                self.push(t + self.fleet.boot.draw(self.rng), _BOOT, t)
        elif step.victims:
            report.kills += len(step.victims)
            if self.last_launch is not None and t - self.last_launch <= self._window():
                report.thrash += len(step.victims)
            self.last_kill = t
            for victim in step.victims:
                del self.daemons[victim]
        self._record(t, step)
        self.trace(t, "tick", step)
        daemons = len(self.daemons) + self.booting
        running = sum(d.busy for d in self.daemons.values())
        report.timeline.append((t, len(self.pending), running, daemons))

    def _window(self) -> float:
        """The hysteresis window, in seconds: WINDOW ticks."""
        return WINDOW * self.fleet.interval_s

    def _record(self, t: float, step: plan.Step) -> None:
        decisions, decision = self.report.decisions, step.decision
        last = decisions[-1] if decisions else None
        row = {
            "t": round(t, 3),
            "action": decision.action,
            "reason": decision.reason,
            "rule": decision.rule,
            "before": step.before(),
        }
        if (
            last is not None
            and decision.action == "tick_noop"
            and last["action"] == "tick_noop"
            and (last["reason"], last["rule"], last["before"])
            == (row["reason"], row["rule"], row["before"])
        ):
            last["repeats"] += 1
            last["last_t"] = row["t"]
            return
        decisions.append({**row, "repeats": 1, "last_t": row["t"]})


def _rank(ordered: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile of sorted values."""
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _kind(spec: QueueSpec) -> str:
    return spec.elasticity.kind if spec.elasticity else "fixed"
