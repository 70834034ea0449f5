"""What a custom scaler (``customScalerUdf``) answered, read as a decision.

The controller calls the scaler with the tick's signals (bounded in time, elsewhere);
this module reads the answer. It never raises, and it clamps the answer to the policy's
bounds: a scaler cannot push a fleet past ``max`` or below ``min``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from lakeshore.domain.jsonsafe import printable
from lakeshore.domain.scaling import ACTIONS, Action, Counters, Decision, Policy, Signals

MAX_QUOTED_CHARS: Final = 500
"""How much of a custom scaler's text (its reason, its error) a reason quotes."""


def interpret_scaler_answer(answer: object, policy: Policy, signals: Signals) -> Decision:
    """Read what a custom scaler returned; never raises.

    It may answer an action string (``"scale_up"``, ``"scale_down"``, ``"tick_noop"``) or a
    mapping ``{"action": …, "reason": optional str}``; anything else is a ``tick_noop``
    whose reason says what was wrong. The answer is clamped to the policy's bounds: a
    launch that would take ``daemon_count + in_flight`` past ``max`` (resolved as for the
    policy's kind) or a kill that would take ``daemon_count`` below ``min`` becomes a
    ``tick_noop`` naming the bound. Counters are not the scaler's business: zeroed.
    """
    parsed = _parse_answer(answer)
    if isinstance(parsed, str):
        return Decision(
            "tick_noop",
            f"custom scaler answer ignored: {parsed} — no-op",
            Counters(),
            "custom_scaler.invalid",
            hint='the scaler must return "scale_up", "scale_down", "tick_noop" '
            'or {"action": …, "reason": …}',
        )
    action, note = parsed
    said = f"custom scaler answered {action}" + (f": {_quote(note)}" if note else "")
    return _clamp(action, said, policy, signals)


def scaler_failed(message: str) -> Decision:
    """A custom scaler that raised or did not answer in time: a no-op with the reason."""
    return Decision(
        "tick_noop",
        f"custom scaler failed: {_quote(message)} — no-op",
        Counters(),
        "custom_scaler.failed",
        hint="fix the custom scaler; it is called again on the next tick",
    )


def _parse_answer(answer: object) -> tuple[Action, str | None] | str:
    """``(action, reason)``, or a description of what is wrong with the answer."""
    if isinstance(answer, str):
        action = _as_action(answer)
        return (action, None) if action else f"unknown action {_repr(answer)}"
    if not isinstance(answer, Mapping):
        return f'expected an action string or a mapping with "action", got {type(answer).__name__}'
    try:
        raw_action, raw_reason = answer.get("action"), answer.get("reason")
    except Exception as exc:  # a user-made mapping may do anything
        return f"reading the answer raised {type(exc).__name__}"
    if raw_action is None:
        return 'the mapping has no "action"'
    action = _as_action(raw_action)
    if action is None:
        return f"unknown action {_repr(raw_action)}"
    if raw_reason is not None and not isinstance(raw_reason, str):
        return f'"reason" must be a string, got {type(raw_reason).__name__}'
    return action, raw_reason


def _as_action(value: object) -> Action | None:
    if not isinstance(value, str):
        return None
    for action in ACTIONS:
        if value == action:
            return action
    return None


def _clamp(action: Action, said: str, policy: Policy, s: Signals) -> Decision:
    ceiling = policy.ceiling
    if action == "scale_up" and ceiling is not None and s.daemon_count + s.in_flight >= ceiling:
        return Decision(
            "tick_noop",
            f"at max ({ceiling}): {said}, daemons {s.daemon_count} + in flight {s.in_flight}",
            Counters(),
            "custom_scaler.at_max",
            blocked_by="max",
            hint=f"raise max above {ceiling}",
        )
    if action == "scale_down" and s.daemon_count <= policy.min:
        return Decision(
            "tick_noop",
            f"at min ({policy.min}): {said}, daemons {s.daemon_count}",
            Counters(),
            "custom_scaler.at_min",
            blocked_by="min",
            hint=f"lower min below {policy.min}",
        )
    return Decision(action, said, Counters(), "custom_scaler")


def _quote(text: str) -> str:
    shown = printable(text)
    if len(shown) > MAX_QUOTED_CHARS:
        return shown[:MAX_QUOTED_CHARS] + "…"
    return shown


def _repr(value: object) -> str:
    try:
        shown = repr(value)
    except Exception:  # a user-made object may do anything
        return f"<unprintable {type(value).__name__}>"
    return _quote(shown)
