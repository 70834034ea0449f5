"""A queue's ``authPolicy``: which tokens may submit to, read from, or claim from it.

The policy is ``{"submit": [...], "read": [...], "claim": [...]}``, every key optional.
Each list names the namespace tokens allowed that action, by token name (the label given
when it was created) or token id (``tok_…``). A key left out leaves that action open to
every token of the namespace, as with no policy at all; an empty list leaves it to the
admin token alone. The admin token is never refused. Tokens Lakeshore mints for the
daemons it launches (worker tokens) pass ``claim``: the controller launched them for the
queue's scope. What each action covers:

``submit``
    submitting (one or a batch) and cancelling its invocations;
``read``
    listing, reading and following (the stream) its invocations;
``claim``
    a daemon's hello that names the queue, and every claim of its invocations.

A stored policy this server cannot read (written before policies were checked) refuses
every token but the admin's: a gate that cannot be read stays shut.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, get_args

from lakeshore.errors import InvalidInput

Action = Literal["submit", "read", "claim"]
ACTIONS: Final[tuple[Action, ...]] = get_args(Action)
MAX_ENTRIES: Final = 256
MAX_ENTRY: Final = 256  # a token's name is at most 256 characters


@dataclass(frozen=True)
class Caller:
    """What the policy reads of the caller."""

    is_admin: bool
    kind: str  # "admin", "namespace" or "worker"
    token_id: str | None = None
    token_name: str | None = None


def parse(raw: Any) -> dict[str, frozenset[str]]:
    """The policy as written: :class:`InvalidInput` naming the first bad field."""
    if not isinstance(raw, Mapping):
        raise InvalidInput(
            'authPolicy is an object: {"submit": [...], "read": [...], "claim": [...]}',
            field="authPolicy",
        )
    policy: dict[str, frozenset[str]] = {}
    for action, names in raw.items():
        if action not in ACTIONS:
            raise InvalidInput(
                f"authPolicy.{action}: not an action; use {', '.join(ACTIONS)}",
                field=f"authPolicy.{action}",
            )
        where = f"authPolicy.{action}"
        if not isinstance(names, list) or len(names) > MAX_ENTRIES:
            raise InvalidInput(
                f"{where} is a list of at most {MAX_ENTRIES} token names or ids", field=where
            )
        for n, name in enumerate(names):
            if not isinstance(name, str) or not 0 < len(name) <= MAX_ENTRY:
                raise InvalidInput(
                    f"{where}[{n}] is a token's name or id (1 to {MAX_ENTRY} characters)",
                    field=f"{where}[{n}]",
                )
        policy[action] = frozenset(names)
    return policy


def refusal(raw: Any, action: Action, caller: Caller, queue: str) -> str | None:
    """Why ``caller`` may not ``action`` on ``queue`` under its stored policy ``raw``, or
    None when it may."""
    if caller.is_admin or raw is None:
        return None
    try:
        policy = parse(raw)
    except InvalidInput:
        return f'queue "{queue}" has an authPolicy this server cannot read: only the admin token may {action}'  # noqa: E501
    allowed = policy.get(action)
    if allowed is None or (action == "claim" and caller.kind == "worker"):
        return None
    if caller.token_id in allowed or (caller.token_name and caller.token_name in allowed):
        return None
    shown = f'"{caller.token_name}"' if caller.token_name else (caller.token_id or "this token")
    return f'queue "{queue}": authPolicy.{action} does not list token {shown}'
