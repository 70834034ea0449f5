"""Every lifecycle transition from every state: allowed, idempotent, or refused."""

from __future__ import annotations

from typing import cast

import pytest

from lakeshore.domain.states import QueueState, Transition, next_state, resets_counters
from lakeshore.errors import Conflict

# (from, transition) -> to; None = refused
TABLE: dict[tuple[QueueState, Transition], QueueState | None] = {
    ("active", "drain"): "draining",
    ("active", "pause"): "paused",
    ("active", "resume"): "active",
    ("active", "archive"): "archived",
    ("active", "unarchive"): "active",
    ("draining", "drain"): "draining",
    ("draining", "pause"): "paused",
    ("draining", "resume"): "active",
    ("draining", "archive"): "archived",
    ("draining", "unarchive"): "active",
    ("paused", "drain"): "draining",
    ("paused", "pause"): "paused",
    ("paused", "resume"): "active",
    ("paused", "archive"): "archived",
    ("paused", "unarchive"): "active",
    ("archived", "drain"): None,
    ("archived", "pause"): None,
    ("archived", "resume"): None,
    ("archived", "archive"): "archived",
    ("archived", "unarchive"): "active",
}


@pytest.mark.parametrize(("start", "action"), list(TABLE), ids=[f"{s}-{a}" for s, a in TABLE])
def test_transition_table(start: QueueState, action: Transition) -> None:
    expected = TABLE[(start, action)]
    if expected is None:
        with pytest.raises(Conflict, match="archived; run unarchive"):
            next_state(start, action)
    else:
        assert next_state(start, action) == expected


@pytest.mark.parametrize("action", ["drain", "pause", "resume"])
def test_a_refusal_of_an_archived_queue_names_the_state_field(action: Transition) -> None:
    with pytest.raises(Conflict) as caught:
        next_state("archived", action)
    assert caught.value.field == "state"
    assert caught.value.message == f"queue is archived; run unarchive before {action}"


def test_a_stored_state_this_server_does_not_know_is_refused_by_name() -> None:
    unknown = cast(QueueState, "frozen")  # written by a newer server
    with pytest.raises(Conflict) as caught:
        next_state(unknown, "drain")
    assert caught.value.field == "state"
    assert caught.value.message == "cannot drain a queue that is frozen"


@pytest.mark.parametrize(
    ("current", "target", "resets"),
    [
        ("active", "paused", True),
        ("active", "draining", True),
        ("active", "archived", True),
        ("active", "active", False),
        ("paused", "active", False),  # a window starts afresh from the resume on
        ("draining", "paused", False),  # not ticked before or after
        ("paused", "draining", False),
        ("archived", "active", False),
    ],
)
def test_leaving_active_resets_the_hysteresis_counters(
    current: QueueState, target: QueueState, resets: bool
) -> None:
    assert resets_counters(current, target) is resets
