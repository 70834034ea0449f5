"""The elasticity controller's decision core: signals, a policy and counters in; one decision out.

Every tick the controller gathers, per queue or pool, four :class:`Signals` (daemon count,
utilization, pending invocations, launches in flight) and asks :func:`decide` what to do
under the queue's :class:`Policy`. The answer is a :class:`Decision`: exactly one of
``scale_up``, ``scale_down`` or ``tick_noop``, with a reason for the audit row, the id of
the rule that fired, and, when nothing happens, a hint saying what would have to change
for it to scale (the "why didn't it scale" answer).

The rules are ``spec/scaling-rules.txt``, to the letter:

``fixed``
    Always ``tick_noop`` (``fixed: no-op``). An unrecognised kind lands here too, with
    ``unknown elasticity.kind="…" — defaulting to no-op``.
``fully_elastic`` and ``max_count``
    ``target = max(min(pending, max), min)``; launch one when
    ``target - daemon_count - in_flight > 0``; kill one when ``daemon_count > target`` and
    ``daemon_count > min``. An unset ``max`` is unbounded for ``fully_elastic`` and 0 for
    ``max_count`` (so an unset ``max`` scales nothing up beyond ``min``).
``pool_with_threshold``
    Below ``min`` (``daemon_count + in_flight < min``) it launches one, whatever the
    utilization: "Keep min daemons warm" (rule ``pool_with_threshold.below_min``). Then
    hysteresis over two consecutive ticks. The counters are updated first
    (``utilization >= high`` counts above, ``<= low`` counts below, anything between resets
    both); then ``scale_up`` when above ``>= 2`` and ``daemon_count + in_flight < max``, or
    ``scale_down`` when below ``>= 2`` and ``daemon_count > min``. Because ``low < high`` at
    most one counter is non-zero after the update, so the two rules never compete; if a
    hand-built policy has ``low >= high`` the ``>= high`` test is applied first, as the spec
    lists it. The acting counter resets after a scale decision; a bound hit is a
    ``tick_noop`` naming the bound and keeps the counter, so the step happens on the first
    tick the bound allows it.

``reservedSlots`` (a queue's headroom, in slots: ``max_invocations`` units) is held free
above demand. For the target kinds it adds ``ceil(reservedSlots / slots_per_daemon)``
daemons to the target (``slots_per_daemon``: the capacity of the daemons the queue
launches, ``daemonTemplate.capacity``, default 1). For ``pool_with_threshold`` it is a
floor like ``min``: fewer free slots than reserved (``capacity - running``, plus those of
launches in flight) launches one (``pool_with_threshold.headroom``), and a scale-down that
would leave fewer is a no-op (``pool_with_threshold.at_headroom``). Unset or 0, the
rules are the spec's exactly.

The counters (``consecutiveAbove`` / ``consecutiveBelow``) are persisted by the caller, so a
restart or a new leader keeps them; they belong to ``pool_with_threshold`` alone and every
other kind hands back zeroed counters.

A custom scaler's answer is read by :mod:`lakeshore.domain.custom_scaler`. Nothing here
does I/O or reads a clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final, Literal, get_args

from lakeshore.domain.jsonsafe import printable
from lakeshore.domain.queue import DEFAULT_THRESHOLD, DEFAULT_THRESHOLD_LOW, Elasticity, QueueSpec

Action = Literal["scale_up", "scale_down", "tick_noop"]
Bound = Literal["max", "min"]

ACTIONS: Final[tuple[Action, ...]] = get_args(Action)
WINDOW: Final = 2
"""Consecutive qualifying ticks ``pool_with_threshold`` needs before it acts."""


@dataclass(frozen=True)
class Signals:
    """What the controller read for one queue or pool on this tick. ``capacity`` (the
    counted daemons' slots) and ``running`` (the invocations leased to them) are what
    ``reservedSlots`` is held against."""

    daemon_count: int
    utilization: float
    pending: int
    in_flight: int
    capacity: int = 0
    running: int = 0


@dataclass(frozen=True)
class Counters:
    """The persisted hysteresis counters: ``consecutiveAbove`` and ``consecutiveBelow``."""

    above: int = 0
    below: int = 0


@dataclass(frozen=True)
class Policy:
    """A queue's elasticity as the rules read it.

    ``kind`` is a plain string so a kind stored by an older or newer server is
    representable (it decides as a no-op). ``max`` stays ``None`` when unset; what that
    means depends on the kind (see :attr:`ceiling`).
    """

    kind: str
    min: int = 0
    max: int | None = None
    high: float = DEFAULT_THRESHOLD
    low: float = DEFAULT_THRESHOLD_LOW
    reserved_slots: int = 0  # the queue's reservedSlots: slots kept free above demand
    slots_per_daemon: int = 1  # a launched daemon's capacity (daemonTemplate.capacity)
    max_step: int | None = 1  # launches (or kills) in one tick; None: no limit (wait_target)
    wait_s: float | None = None  # wait_target: the p95 submit → start wait to keep under
    service_s: float | None = None  # wait_target: the service time's hint
    boot_s: float | None = None  # wait_target: the boot time's hint

    @classmethod
    def from_spec(cls, spec: QueueSpec) -> Policy:
        """The policy of a queue: its elasticity, with its ``reservedSlots`` and the
        capacity of the daemons it launches."""
        template = spec.daemon_template
        return replace(
            cls.from_elasticity(spec.elasticity),
            reserved_slots=spec.reserved_slots or 0,
            slots_per_daemon=(template.capacity if template and template.capacity else 1),
        )

    @property
    def headroom(self) -> int:
        """``reservedSlots`` in daemons: as many launched daemons as hold that many slots."""
        return -(-self.reserved_slots // self.slots_per_daemon)

    @classmethod
    def from_elasticity(cls, elasticity: Elasticity | None) -> Policy:
        """The policy of a queue; no elasticity object means ``fixed``."""
        if elasticity is None:
            return cls(kind="fixed")
        step = elasticity.max_step
        return cls(
            kind=elasticity.kind,
            min=elasticity.min or 0,
            max=elasticity.max,
            high=elasticity.high,
            low=elasticity.low,
            max_step=step if step is not None or elasticity.kind == "wait_target" else 1,
            wait_s=elasticity.wait_s,
            service_s=elasticity.service_s,
            boot_s=elasticity.boot_s,
        )

    def step_of(self, wanted: int) -> int:
        """How many of ``wanted`` launches (or kills) one tick makes: ``max_step`` at most."""
        return wanted if self.max_step is None else min(wanted, self.max_step)

    @property
    def ceiling(self) -> int | None:
        """``max`` as the rules apply it: unset is unbounded, except 0 for ``max_count``."""
        return 0 if self.max_defaulted else self.max

    @property
    def max_defaulted(self) -> bool:
        """Whether the ceiling is ``max_count``'s default of 0 rather than a written ``max``."""
        return self.max is None and self.kind == "max_count"


@dataclass(frozen=True)
class Decision:
    """One tick's answer for one queue or pool.

    ``rule`` is a short machine-readable id of the rule that fired (``fixed``,
    ``unknown_kind``, ``fully_elastic.scale_up``, ``pool_with_threshold.at_max`` …).
    ``counters`` are the counters to persist. ``target`` is the fleet size the decision
    aims at, when the rule has one. ``blocked_by`` names the bound (``max`` / ``min``)
    that stopped a step; ``hint`` says in words what would have to change for it to scale.
    ``count`` is how many daemons a scale decision launches or kills (``max_step`` at
    most; 1 under the spec's rule). ``estimates`` is what a ``wait_target`` decision was
    computed from (each estimate with its source, the predicted waits), for the audit row.
    """

    action: Action
    reason: str
    counters: Counters
    rule: str
    target: int | None = None
    blocked_by: Bound | None = None
    hint: str | None = None
    count: int = 1
    estimates: Mapping[str, Any] | None = None


def no_provider_reason(queue_name: str) -> str:
    """The spec's reason for a launch with no provider to call."""
    return f'queue "{queue_name}" has no providerRef / daemonTemplate.provider — cannot launch'


def decide(policy: Policy, signals: Signals, counters: Counters) -> Decision:
    """Apply ``policy`` to this tick's signals: exactly one decision, never an exception."""
    rule = _RULES.get(policy.kind)
    if rule is None:
        return _unknown_kind(policy.kind)
    return rule(policy, signals, counters)


def downgrade(decision: Decision, failure: str) -> Decision:
    """A scale decision that could not be carried out (a failed launch, no eligible victim).

    It becomes a ``tick_noop`` with the failure appended to its reason, as the spec asks;
    the rule id and the counters are kept, so the audit row still says which rule fired.
    For ``pool_with_threshold`` the next step still needs a fresh window; the target
    kinds (``fully_elastic``, ``max_count``) try again on the next tick.
    """
    return replace(decision, action="tick_noop", reason=f"{decision.reason}; {failure}")


# --- fixed and unknown kinds -------------------------------------------------------------


def _fixed(policy: Policy, signals: Signals, counters: Counters) -> Decision:
    return Decision(
        "tick_noop",
        "fixed: no-op",
        Counters(),
        "fixed",
        hint="fixed never scales; set elasticity.kind to scale automatically",
    )


def _unknown_kind(kind: str) -> Decision:
    return Decision(
        "tick_noop",
        f'unknown elasticity.kind="{printable(kind)}" — defaulting to no-op',
        Counters(),
        "unknown_kind",
        hint="set elasticity.kind to fixed, fully_elastic, pool_with_threshold or max_count",
    )


# --- fully_elastic and max_count: a target from pending ----------------------------------


def _fully_elastic(policy: Policy, signals: Signals, counters: Counters) -> Decision:
    return _toward_target(policy, signals)


def _max_count(policy: Policy, signals: Signals, counters: Counters) -> Decision:
    return _toward_target(policy, signals)


def target_of(policy: Policy, pending: int) -> int:
    """``max(min(pending + headroom, max), min)`` with ``max`` resolved for the policy's
    kind; ``headroom`` is ``reservedSlots`` in daemons (0 when unset: the spec's rule)."""
    ceiling = policy.ceiling
    wanted = pending + policy.headroom
    capped = wanted if ceiling is None else min(wanted, ceiling)
    return max(capped, policy.min)


def launch_words(count: int) -> str:
    """``launch`` (one: the spec's words), or ``launch N``."""
    return "launch" if count == 1 else f"launch {count}"


def kill_words(count: int) -> str:
    """``kill one`` (the spec's words), or ``kill N``."""
    return "kill one" if count == 1 else f"kill {count}"


def _toward_target(policy: Policy, s: Signals) -> Decision:
    kind, target = policy.kind, target_of(policy, s.pending)
    if (short := target - s.daemon_count - s.in_flight) > 0:
        n = policy.step_of(short)
        return Decision(
            "scale_up",
            f"target {target} > daemons {s.daemon_count} + in flight {s.in_flight} → "
            f"{launch_words(n)}",
            Counters(),
            f"{kind}.scale_up",
            target=target,
            count=n,
        )
    # target >= min, so "> min" follows from "> target"; kept because the spec states it
    if s.daemon_count > target and s.daemon_count > policy.min:
        n = policy.step_of(s.daemon_count - target)
        return Decision(
            "scale_down",
            f"daemons {s.daemon_count} > target {target} and > min {policy.min} → {kill_words(n)}",
            Counters(),
            f"{kind}.scale_down",
            target=target,
            count=n,
        )
    return _target_noop(policy, s, target)


def _target_noop(policy: Policy, s: Signals, target: int) -> Decision:
    kind, have = policy.kind, f"daemons {s.daemon_count} + in flight {s.in_flight}"
    if s.pending + policy.headroom > target:  # only the ceiling holds the target under it
        unset = "max unset → 0 for max_count; " if policy.max_defaulted else ""
        return Decision(
            "tick_noop",
            f"at max ({policy.ceiling}): {unset}pending {s.pending} → target {target}, {have}",
            Counters(),
            f"{kind}.at_max",
            target=target,
            blocked_by="max",
            hint=f"{'set' if policy.max_defaulted else 'raise'} max above {target}",
        )
    if s.pending < policy.min and s.daemon_count == target:
        return Decision(
            "tick_noop",
            f"at min ({policy.min}): pending {s.pending} → target {target}, "
            f"daemons {s.daemon_count}",
            Counters(),
            f"{kind}.at_min",
            target=target,
            blocked_by="min",
            hint=f"lower min below {policy.min} to scale down; {_up_hint(policy, s)}",
        )
    if s.daemon_count < target:
        reason = f"target {target} <= {have}: waiting on launches"
        return Decision(
            "tick_noop", reason, Counters(), f"{kind}.in_flight", target, hint=_up_hint(policy, s)
        )
    return Decision(
        "tick_noop",
        f"target {target} = daemons {s.daemon_count} (in flight {s.in_flight}): steady",
        Counters(),
        f"{kind}.steady",
        target=target,
        hint=f"{_up_hint(policy, s)}; {_down_hint(policy, s)}",
    )


def _up_hint(policy: Policy, s: Signals) -> str:
    ceiling = policy.ceiling
    if ceiling is not None and s.daemon_count + s.in_flight >= max(ceiling, policy.min):
        unset = " (unset → 0 for max_count)" if policy.max_defaulted else ""
        return f"at max ({ceiling}){unset}; raise max to scale up"
    return f"scales up when pending exceeds daemons + in flight ({s.daemon_count} + {s.in_flight})"


def _down_hint(policy: Policy, s: Signals) -> str:
    if s.daemon_count <= policy.min:
        return f"scales down only when min ({policy.min}) is lowered"
    return f"scales down when pending drops below daemons ({s.daemon_count})"


# --- pool_with_threshold: hysteresis on utilization --------------------------------------


def update_counters(policy: Policy, utilization: float, counters: Counters) -> Counters:
    """The counters after this tick's reading: above, below, or the dead band (both reset).

    A counter stops at the window (:data:`WINDOW`): the rules only ask whether it has
    reached it, so a higher count would change no decision — and a pool held at a bound
    would then decide a new no-op every tick (its reason and counters changing), which
    could never fold into one feed row. The row's repeat count tells how long it held."""
    if utilization >= policy.high:
        return Counters(above=min(counters.above + 1, WINDOW), below=0)
    if utilization <= policy.low:
        return Counters(above=0, below=min(counters.below + 1, WINDOW))
    return Counters()


def _pool_with_threshold(policy: Policy, s: Signals, counters: Counters) -> Decision:
    updated = update_counters(policy, s.utilization, counters)
    floor = _pool_below_min(policy, s, updated) or _pool_headroom(policy, s, updated)
    if floor is not None:
        return floor
    if updated.above:
        return _pool_up(policy, s, updated)
    if updated.below:
        return _pool_down(policy, s, updated)
    u, low, high = _fmt(s.utilization, policy.low, policy.high)
    return Decision(
        "tick_noop",
        f"utilization {u} between {low} and {high} (dead band): counters reset",
        updated,
        "pool_with_threshold.dead_band",
        hint=f"scales up after {WINDOW} ticks at utilization >= {high}, "
        f"down after {WINDOW} ticks at <= {low}",
    )


def _pool_below_min(policy: Policy, s: Signals, c: Counters) -> Decision | None:
    """ "Keep min daemons warm": under ``min``, counting launches in flight, launch one
    whatever the utilization (the counters still take this tick's reading; a window that
    was due is spent by this launch). Never past a ceiling."""
    have = s.daemon_count + s.in_flight
    ceiling = policy.ceiling
    if have >= policy.min or (ceiling is not None and have >= ceiling):
        return None
    spent = replace(c, above=0) if c.above >= WINDOW else c
    upto = policy.min if ceiling is None else min(policy.min, ceiling)
    n = policy.step_of(upto - have)
    return Decision(
        "scale_up",
        f"below min ({policy.min}): daemons {s.daemon_count} + in flight {s.in_flight} → "
        f"{launch_words(n)}",
        spent,
        "pool_with_threshold.below_min",
        have + n,
        count=n,
    )


def _free_slots(policy: Policy, s: Signals) -> int:
    """Slots free now, and those the launches in flight will bring."""
    return s.capacity - s.running + s.in_flight * policy.slots_per_daemon


def _pool_headroom(policy: Policy, s: Signals, c: Counters) -> Decision | None:
    """``reservedSlots``: fewer free slots than reserved (those booting counted), launch
    one, whatever the utilization, as below ``min``. Never past a ceiling."""
    free, have, ceiling = _free_slots(policy, s), s.daemon_count + s.in_flight, policy.ceiling
    if free >= policy.reserved_slots or (ceiling is not None and have >= ceiling):
        return None
    spent = replace(c, above=0) if c.above >= WINDOW else c
    return Decision(
        "scale_up",
        f"headroom: {free} free slot{'s' if free != 1 else ''} (booting included) "
        f"< reservedSlots {policy.reserved_slots} → launch",
        spent,
        "pool_with_threshold.headroom",
        have + 1,
    )


def _pool_up(policy: Policy, s: Signals, c: Counters) -> Decision:
    u, high = _fmt(s.utilization, policy.high)
    seen = f"utilization {u} >= {high} for {_ticks(c.above)}"
    have = s.daemon_count + s.in_flight
    if c.above < WINDOW:
        return Decision(
            "tick_noop",
            f"{seen} (needs {WINDOW})",
            c,
            "pool_with_threshold.warming_up",
            hint=f"needs utilization >= {high} on {_ticks(WINDOW - c.above, 'more ')}",
        )
    ceiling = policy.ceiling
    if ceiling is not None and have >= ceiling:
        return Decision(
            "tick_noop",
            f"at max ({ceiling}): {seen}, daemons {s.daemon_count} + in flight {s.in_flight}",
            c,
            "pool_with_threshold.at_max",
            blocked_by="max",
            hint=f"raise max above {ceiling}",
        )
    n = policy.step_of(policy.max_step or 1) if ceiling is None else policy.step_of(ceiling - have)
    return Decision(
        "scale_up",
        f"{seen} → {launch_words(n)}",
        replace(c, above=0),
        "pool_with_threshold.scale_up",
        have + n,
        count=n,
    )


def _pool_down(policy: Policy, s: Signals, c: Counters) -> Decision:
    u, low = _fmt(s.utilization, policy.low)
    seen = f"utilization {u} <= {low} for {_ticks(c.below)}"
    if c.below < WINDOW:
        return Decision(
            "tick_noop",
            f"{seen} (needs {WINDOW})",
            c,
            "pool_with_threshold.cooling_down",
            hint=f"needs utilization <= {low} on {_ticks(WINDOW - c.below, 'more ')}",
        )
    if s.daemon_count <= policy.min:
        return Decision(
            "tick_noop",
            f"at min ({policy.min}): {seen}, daemons {s.daemon_count}",
            c,
            "pool_with_threshold.at_min",
            blocked_by="min",
            hint=f"lower min below {policy.min}",
        )
    left = _free_slots(policy, s) - policy.slots_per_daemon
    if policy.reserved_slots and left < policy.reserved_slots:
        return Decision(
            "tick_noop",
            f"headroom: {seen}, but one daemon fewer would leave {max(left, 0)} free "
            f"slot{'s' if left != 1 else ''} < reservedSlots {policy.reserved_slots}",
            c,
            "pool_with_threshold.at_headroom",
            hint=f"lower reservedSlots below {policy.reserved_slots} to scale down",
        )
    n = policy.step_of(s.daemon_count - policy.min)
    if policy.reserved_slots:  # as many as leave reservedSlots free
        spare = (_free_slots(policy, s) - policy.reserved_slots) // policy.slots_per_daemon
        n = max(1, min(n, spare))
    return Decision(
        "scale_down",
        f"{seen} → {kill_words(n)}",
        replace(c, below=0),
        "pool_with_threshold.scale_down",
        s.daemon_count - n,
        count=n,
    )


def _ticks(n: int, more: str = "") -> str:
    return f"{n} {more}tick" if n == 1 else f"{n} {more}ticks"


def _fmt(value: float, *thresholds: float) -> tuple[str, ...]:
    """``value`` and ``thresholds`` with 2 decimals, or more where 2 would hide a difference.

    0.795 against a threshold of 0.80 prints as ``0.795``, not as a misleading ``0.80``.
    """
    digits = 2
    while digits < 6 and any(
        value != t and f"{value:.{digits}f}" == f"{t:.{digits}f}" for t in thresholds
    ):
        digits += 1
    return tuple(f"{v:.{digits}f}" for v in (value, *thresholds))


_Rule = Callable[[Policy, Signals, Counters], Decision]
_RULES: Final[dict[str, _Rule]] = {
    "fixed": _fixed,
    "fully_elastic": _fully_elastic,
    "pool_with_threshold": _pool_with_threshold,
    "max_count": _max_count,
}
