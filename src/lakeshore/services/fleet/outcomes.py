"""What a tick's step became: its audit row and its answer to the caller.

An :class:`Outcome` is a plan's step carried out (or downgraded when it could not be):
the signals after it and what it acted on (its launches, its victims). The controller
writes its row in ``elasticity_events`` and answers it as JSON; a run of identical
no-ops of one scope folds into one row, by :attr:`Outcome.mark`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from lakeshore.elasticity import plan


def noop_outcomes(steps: Sequence[plan.Step]) -> list[Outcome | None]:
    """The outcome of each step with nothing to carry out (``None`` for the others)."""
    return [None if s.launch or s.victim else Outcome(s, s.before()) for s in steps]


def as_json(outcomes: Sequence[Outcome]) -> list[dict[str, Any]]:
    return [outcome.to_json() for outcome in outcomes]


@dataclass(frozen=True)
class Outcome:
    """A step carried out: the step as it ended (downgraded if it could not act), the
    signals after it, and what it acted on (provider and launch id, or victim)."""

    step: plan.Step
    after: dict[str, Any]
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        unit, decision = self.step.unit, self.step.decision
        return {
            "namespace": unit.namespace,
            "queueName": unit.scope,  # the spec's name: a queue's, or "pool:<name>"
            "scope": unit.scope,  # the same, as earlier servers named it
            "action": decision.action,
            "reason": decision.reason,
            "rule": decision.rule,
            "before": self.step.before(),
            "after": self.after,
            "hint": decision.hint,
            **({"count": decision.count} if decision.count != 1 else {}),
            **({"estimates": plan.estimates_json(self.step)} if decision.estimates else {}),
            **self.detail,
        }

    @functools.cached_property
    def mark(self) -> tuple[Any, ...] | None:
        """What makes two no-ops of one scope the same decision (``None``: not a no-op,
        never folded): everything its audit row says but the time."""
        if self.step.action != "tick_noop":
            return None
        d, s = self.step.decision, self.step.signals
        return (
            d.reason,
            d.rule,
            d.target,
            d.blocked_by,
            d.hint,
            d.counters,
            (s.daemon_count, round(s.utilization, 4), s.pending, s.in_flight),
            repr(sorted(self.after.items())),
            repr(sorted(self.detail.items())),
        )

    def row(self, now: datetime) -> dict[str, Any]:
        """The audit row (``elasticity_events``) of this outcome."""
        unit, decision = self.step.unit, self.step.decision
        return {
            "namespace_id": unit.namespace_id,
            "queue_name": unit.scope,
            "action": decision.action,
            "reason": decision.reason,
            "before": self.step.before(),
            "after": self.after,
            "signals": {
                "rule": decision.rule,
                "target": decision.target,
                "blocked_by": decision.blocked_by,
                "hint": decision.hint,
                "counters": {"above": decision.counters.above, "below": decision.counters.below},
                **({"count": decision.count} if decision.count != 1 else {}),
                **({"estimates": plan.estimates_json(self.step)} if decision.estimates else {}),
                **self.detail,
            },
            "created_at": now,
        }
