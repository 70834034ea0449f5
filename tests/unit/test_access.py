"""authPolicy's rule, as a table: who may submit to, read from, or claim from a queue."""

from __future__ import annotations

from typing import Any

import pytest

from lakeshore.domain.access import Caller, refusal

ADMIN = Caller(is_admin=True, kind="admin")
CI = Caller(is_admin=False, kind="namespace", token_id="tok_1", token_name="ci")
UNNAMED = Caller(is_admin=False, kind="namespace", token_id="tok_2")
LAUNCHED = Caller(is_admin=False, kind="worker", token_id="tok_3")
GATE = 'queue "q": authPolicy.'
UNREADABLE = 'queue "q" has an authPolicy this server cannot read: only the admin token may read'


@pytest.mark.parametrize(
    ("policy", "action", "caller", "refused"),
    [
        (None, "submit", CI, None),  # no policy: open to the namespace's tokens
        ({"read": []}, "submit", CI, None),  # a key left out leaves that action open
        ({"submit": ["ci"]}, "submit", CI, None),  # by name
        ({"submit": ["tok_2"]}, "submit", UNNAMED, None),  # by id
        ({"submit": ["ops"]}, "submit", CI, GATE + 'submit does not list token "ci"'),
        ({"read": ["ci"]}, "read", UNNAMED, GATE + 'read does not list token tok_2'),
        ({"submit": []}, "submit", CI, GATE + 'submit does not list token "ci"'),
        ({"submit": []}, "submit", ADMIN, None),  # the admin token, always
        ({"claim": []}, "claim", LAUNCHED, None),  # a daemon Lakeshore launched
        ({"submit": []}, "submit", LAUNCHED, GATE + 'submit does not list token tok_3'),
        ({"claim": ["ci"]}, "claim", UNNAMED, GATE + 'claim does not list token tok_2'),
        (["opaque"], "read", CI, UNREADABLE),
        (["opaque"], "read", ADMIN, None),
    ],
)  # fmt: skip
def test_the_rule(policy: Any, action: Any, caller: Caller, refused: str | None) -> None:
    assert refusal(policy, action, caller, "q") == refused
