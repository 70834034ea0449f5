"""The ``wait_target`` policy: keep the p95 submit → start wait under ``wait_s`` at the
lowest daemon-hours.

A scope's fleet is sized from three estimates, each with its source (``learned`` from
the scope's own history, a ``hint`` written on the policy, for the boot time its
``provider``'s configured ``boot_s``, or the ``default``): the
service time (an invocation's start → finish), the boot time (a launch's request → its
daemon's hello) and the arrival rate. Two needs are computed and the larger wins:

- the **steady need**: the fewest daemons whose slots serve the arrival rate with a p95
  wait at or under the target — Erlang C (M/M/c): ``P(wait > t) = C(c, a) ·
  exp(-(cμ - λ) t)``;
- the **backlog need**: the pending invocations (and the delayed ones falling due within
  a boot, which count as arriving now) drain as a fluid: the ready daemons' free slots
  start work at once, every slot starts one every service time, and launches (and those
  in flight) add their slots when a boot ends. The fewest launches whose backlog's last
  invocation starts within the target — or, when no launch can (a boot longer than the
  target), within a service time of the boot. No launch is made when the present fleet,
  in flight included, starts the last of the backlog before a new daemon would boot.

It launches all it needs at once (``max_step``, unset: no limit below ``max``). It kills
only daemons idle for longer than a boot takes (a gap shorter than a boot costs no boot),
and only as many as leave the target met: the steady need, and the backlog's drain.

Pure arithmetic: the caller gives the estimates and the idle times; no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from lakeshore.domain.scaling import Counters, Decision, Policy, Signals, kill_words, launch_words

P95_TAIL: Final = 0.05
DEFAULT_SERVICE_S: Final = 60.0
DEFAULT_BOOT_S: Final = 60.0
NEVER: Final = math.inf
STEADY_SHARE: Final = 0.4  # of the target: the steady need's p95, with room for noise
MAX_SLOTS: Final = 100_000  # the steady need's search stops here (Erlang C is O(slots))
TIMES: Final = "\u00d7"  # the multiplication sign: backlog N (times) service time


@dataclass(frozen=True)
class Estimate:
    """One estimate and where it came from: ``learned`` (with its sample count), a
    ``hint`` of the policy, the ``provider``'s configured value (the boot time), or the
    ``default``."""

    value: float
    source: str
    samples: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"value": round(self.value, 3), "source": self.source, "samples": self.samples}


@dataclass(frozen=True)
class Demand:
    """What ``wait_target`` reads beyond the signals: the estimates, the delayed work due
    within a boot, and how long each idle daemon has been idle (worker id → seconds)."""

    service: Estimate
    boot: Estimate
    arrivals: Estimate  # per second
    due_soon: int = 0
    idle_for: Mapping[str, float] = field(default_factory=dict)


def p95_steady(slots: int, rate: float, service_s: float) -> float:
    """The p95 wait (seconds) of ``slots`` servers at Poisson ``rate`` with exponential
    service of mean ``service_s`` (Erlang C); infinite when they cannot keep up."""
    if rate <= 0:
        return 0.0
    if slots <= 0:
        return NEVER
    mu = 1.0 / service_s
    a = rate / mu
    if a >= slots:
        return NEVER
    c = erlang_c(slots, a)
    if c <= P95_TAIL:
        return 0.0
    return math.log(c / P95_TAIL) / (slots * mu - rate)


def erlang_c(slots: int, a: float) -> float:
    """The probability an arrival waits, with ``slots`` servers and ``a`` erlangs."""
    # Erlang B by its recurrence (stable for large fleets), then C from B
    b = 1.0
    for k in range(1, slots + 1):
        b = a * b / (k + a * b)
    rho = a / slots
    return b / (1 - rho + rho * b)


def steady_budget(policy: Policy, d: Demand) -> float:
    """The p95 wait the steady fleet is sized for. A queue that builds can still be met
    by a launch when a boot is shorter than the target: the fleet holds what a boot
    leaves of it. Otherwise a launch comes too late and the fleet alone holds the
    target, with room for the estimates' noise (:data:`STEADY_SHARE` of it)."""
    wait_s = policy.wait_s or 0.0
    return max(wait_s - d.boot.value, wait_s * STEADY_SHARE)


def steady_need(policy: Policy, d: Demand) -> int:
    """The fewest daemons whose slots keep the steady p95 wait within its budget."""
    wait_s, per = steady_budget(policy, d), policy.slots_per_daemon
    rate, service_s = d.arrivals.value, d.service.value
    if rate <= 0:
        return 0
    if rate * d.boot.value < 1 and d.boot.value <= (policy.wait_s or 0.0):
        # arrivals further apart than a boot, and a boot within the target: a daemon
        # kept warm through each gap costs more than the cold start it saves
        return 0
    top = MAX_SLOTS if policy.max is None else min(MAX_SLOTS, policy.max * per)
    lo = min(top, max(1, math.floor(rate * service_s) + 1))  # fewer cannot keep up
    if p95_steady(top, rate, service_s) > wait_s:
        return -(-top // per)  # even the most is not enough: the most
    hi = top
    while lo < hi:  # the p95 wait falls as slots grow: the fewest within the budget
        mid = (lo + hi) // 2
        if p95_steady(mid, rate, service_s) <= wait_s:
            hi = mid
        else:
            lo = mid + 1
    return -(-lo // per)


def last_start(
    backlog: int, s: Signals, policy: Policy, d: Demand, *, ready: int, arriving: int
) -> float:
    """When the last of ``backlog`` starts (seconds from now), as a fluid: ``ready``
    daemons now (their free slots take work at once), ``arriving`` more when a boot ends,
    the arrival rate adding to the queue meanwhile."""
    if backlog <= 0:
        return 0.0
    per, service_s, boot_s, rate = (
        policy.slots_per_daemon,
        d.service.value,
        d.boot.value,
        d.arrivals.value,
    )
    k0 = ready * per
    free = max(0, k0 - s.running) if ready == s.daemon_count else k0
    if free >= backlog:
        return 0.0
    r1 = k0 / service_s - rate
    if r1 > 0 and (t1 := (backlog - free) / r1) <= boot_s:
        return t1
    k1 = arriving * per
    started = free + k0 * boot_s / service_s + k1 - rate * boot_s
    if started >= backlog:
        return boot_s
    r2 = (k0 + k1) / service_s - rate
    if r2 <= 0:
        return NEVER
    return boot_s + (backlog - started) / r2


@dataclass(frozen=True)
class _Look:
    """The numbers a decision is explained by."""

    backlog: int
    steady: int
    now_s: float  # the backlog's last start with the fleet as it is
    then_s: float  # the same with the decision's launches or kills
    p95_now: float
    p95_then: float


def decide(policy: Policy, s: Signals, d: Demand) -> Decision:
    """One ``wait_target`` decision: launch what the target needs, kill what it does not."""
    wait_s = policy.wait_s or 0.0
    have = s.daemon_count + s.in_flight
    backlog = s.pending + d.due_soon
    ceiling = policy.max
    room = NEVER if ceiling is None else max(0, ceiling - have)
    steady = max(steady_need(policy, d), policy.min)

    def drain(ready: int, extra: int) -> float:
        return last_start(backlog, s, policy, d, ready=ready, arriving=s.in_flight + extra)

    def p95(ready: int, extra: int) -> float:
        fleet = (ready + s.in_flight + extra) * policy.slots_per_daemon
        return max(drain(ready, extra), p95_steady(fleet, d.arrivals.value, d.service.value))

    now_s = drain(s.daemon_count, 0)
    wanted = _backlog_launches(now_s, wait_s, d.boot.value, d.service.value, room, drain, s)
    wanted = max(wanted, steady - have)
    if ceiling is not None:
        wanted = min(wanted, max(0, ceiling - have))
    if wanted > 0:
        n = policy.step_of(wanted)
        look = _Look(
            backlog,
            steady,
            now_s,
            drain(s.daemon_count, n),
            p95(s.daemon_count, 0),
            p95(s.daemon_count, n),
        )
        return _decision("scale_up", f"{launch_words(n)}", policy, s, d, look, n, have + n)
    kill = _kills(policy, s, d, steady, backlog, wait_s, drain)
    if kill > 0:
        look = _Look(
            backlog,
            steady,
            now_s,
            drain(s.daemon_count - kill, 0),
            p95(s.daemon_count, 0),
            p95(s.daemon_count - kill, 0),
        )
        return _decision("scale_down", kill_words(kill), policy, s, d, look, kill, have - kill)
    look = _Look(backlog, steady, now_s, now_s, p95(s.daemon_count, 0), p95(s.daemon_count, 0))
    return _noop(policy, s, d, look, have, steady)


def _backlog_launches(
    now_s: float,
    wait_s: float,
    boot_s: float,
    service_s: float,
    room: float,
    drain: Any,
    s: Signals,
) -> int:
    """The fewest launches that start the last of the backlog within the target (or, if
    none can, within a service time of the boot; or as soon as ``room`` allows)."""
    if now_s <= wait_s or now_s <= boot_s or room <= 0:
        return 0  # met already, or drained before a new daemon would be up
    top = int(min(room, 100_000))
    goal = wait_s
    if drain(s.daemon_count, top) > goal:
        goal = max(wait_s, boot_s + service_s, drain(s.daemon_count, top))
    lo, hi = 1, top
    while lo < hi:  # the drain shortens as launches grow: the fewest that meet the goal
        mid = (lo + hi) // 2
        if drain(s.daemon_count, mid) <= goal:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _kills(
    policy: Policy, s: Signals, d: Demand, steady: int, backlog: int, wait_s: float, drain: Any
) -> int:
    """Idle daemons to kill: idle for longer than a boot, and only as many as leave the
    steady need and the backlog's drain within the target."""
    if s.in_flight:
        return 0
    idle_long = sum(1 for t in d.idle_for.values() if t > d.boot.value)
    spare = s.daemon_count - max(steady, policy.min)
    k = policy.step_of(min(idle_long, spare))
    while k > 0 and backlog and drain(s.daemon_count - k, 0) > wait_s:
        k -= 1
    return max(k, 0)


def _fmt_s(seconds: float) -> str:
    if seconds == NEVER:
        return "never"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7_200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3_600:.1f} h"


def estimates_json(d: Demand, look: _Look | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "service_s": d.service.to_json(),
        "boot_s": d.boot.to_json(),
        "arrivals_per_s": {**d.arrivals.to_json(), "value": round(d.arrivals.value, 5)},
        "due_soon": d.due_soon,
    }
    if look is not None:
        out.update(
            backlog=look.backlog,
            steady_need=look.steady,
            p95_wait_s_without=_round(look.p95_now),
            p95_wait_s_with=_round(look.p95_then),
        )
    return out


def _round(value: float) -> float | None:
    return None if value == NEVER else round(value, 1)


def _starts(would: str, seconds: float) -> str:
    if seconds == NEVER:
        return f"{would} never start its last"
    return (
        f"{would} start its last in {_fmt_s(seconds)}"
        if would
        else f" start it within {_fmt_s(seconds)}"
    )


def _story(policy: Policy, s: Signals, d: Demand, look: _Look, n: int, after: int) -> str:
    """The decision in words: ``backlog 180 (times) 45 s with 2 daemons would start its
    last in 68 min; 8 daemons, booting in ~2 min, start it within 4 min``."""
    service, boot = d.service.value, d.boot.value
    parts = []
    if look.backlog:
        parts.append(
            f"backlog {look.backlog} {TIMES} {_fmt_s(service)} with {s.daemon_count} "
            f"daemon{'s' if s.daemon_count != 1 else ''}"
            + (f" (+{s.in_flight} booting)" if s.in_flight else "")
            + _starts(" would", look.now_s)
        )
        if n:
            parts.append(f"{after} daemons, booting in ~{_fmt_s(boot)},{_starts('', look.then_s)}")
    target = _fmt_s(policy.wait_s or 0)
    if look.backlog or n or after != s.daemon_count + s.in_flight:
        parts.append(
            f"arrivals {d.arrivals.value * 60:.2f}/min need {look.steady} for p95 ≤ {target}"
        )
    else:  # a steady fleet: only what its decision turns on, so a run of them folds
        parts.append(
            f"{s.daemon_count} daemon{'s' if s.daemon_count != 1 else ''}"
            + (f" (+{s.in_flight} booting)" if s.in_flight else "")
            + f", steady need {look.steady} for p95 ≤ {target}"
        )
    return "; ".join(parts)


def _decision(
    action: Any, verb: str, policy: Policy, s: Signals, d: Demand, look: _Look, n: int, after: int
) -> Decision:
    why = _story(policy, s, d, look, n if action == "scale_up" else 0, after)
    if action == "scale_down":
        why = f"{why}; {n} idle for longer than a boot (~{_fmt_s(d.boot.value)})"
    return Decision(
        action,
        f"{verb}: {why}",
        Counters(),
        f"wait_target.{action}",
        target=after,
        count=n,
        estimates=estimates_json(d, look),
    )


def _noop(policy: Policy, s: Signals, d: Demand, look: _Look, have: int, steady: int) -> Decision:
    ceiling = policy.max
    story = _story(policy, s, d, look, 0, have)
    if ceiling is not None and have >= ceiling and look.p95_now > (policy.wait_s or 0):
        return Decision(
            "tick_noop",
            f"at max ({ceiling}): {story}",
            Counters(),
            "wait_target.at_max",
            target=have,
            blocked_by="max",
            hint=f"raise max above {ceiling} to meet the wait target",
            estimates=estimates_json(d, look),
        )
    if look.backlog and look.now_s <= d.boot.value and look.now_s > (policy.wait_s or 0):
        rule, hint = "wait_target.drains_first", "a new daemon would boot after the backlog drains"
        head = f"no launch, a boot (~{_fmt_s(d.boot.value)}) ends after the drain"
    else:
        rule, hint = "wait_target.steady", "launches when the predicted p95 wait exceeds the target"
        head = "target met"
    return Decision(
        "tick_noop",
        f"{head}: {story}",
        Counters(),
        rule,
        target=have,
        hint=hint,
        estimates=estimates_json(d, look),
    )
