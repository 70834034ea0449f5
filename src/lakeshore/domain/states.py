"""Queue lifecycle: which state each transition leads to, and from where.

``active`` dispatches and scales; ``draining`` refuses new submits but still dispatches
what it holds; ``paused`` accepts submits and dispatches nothing; ``archived`` is
read-only and hidden from lists. Asking for the state a queue is already in succeeds
and changes nothing, so scripts can repeat themselves safely.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

from lakeshore.errors import Conflict

QueueState = Literal["active", "draining", "paused", "archived"]
Transition = Literal["drain", "pause", "resume", "archive", "unarchive"]

QUEUE_STATES: Final = get_args(QueueState)
TRANSITIONS: Final = get_args(Transition)

# transition -> (target state, states it may start from besides the target itself)
_RULES: Final[dict[Transition, tuple[QueueState, frozenset[QueueState]]]] = {
    "drain": ("draining", frozenset({"active", "paused"})),
    "pause": ("paused", frozenset({"active", "draining"})),
    "resume": ("active", frozenset({"paused", "draining"})),
    "archive": ("archived", frozenset({"active", "draining", "paused"})),
    "unarchive": ("active", frozenset({"archived", "draining", "paused"})),
}


def next_state(current: QueueState, transition: Transition) -> QueueState:
    """The state ``transition`` leads to from ``current``; :class:`Conflict` if refused."""
    target, sources = _RULES[transition]
    if current == target or current in sources:
        return target
    if current == "archived":
        raise Conflict(f"queue is archived; run unarchive before {transition}", field="state")
    raise Conflict(f"cannot {transition} a queue that is {current}", field="state")


def resets_counters(current: QueueState, target: QueueState) -> bool:
    """Whether a move from ``current`` to ``target`` zeroes the queue's hysteresis
    counters: it leaves ``active``, so the controller stops ticking it, and a window
    under way must not carry over to its first tick after a resume."""
    return current == "active" and target != "active"
