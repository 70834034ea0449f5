"""Every lifecycle transition from every state: allowed, idempotent, or refused."""

from __future__ import annotations

import pytest

from lakeshore.domain.states import QueueState, Transition, next_state
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
