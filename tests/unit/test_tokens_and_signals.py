from __future__ import annotations

import pytest

from lakeshore.domain import tokens
from lakeshore.domain.signals import utilization


def test_a_minted_token_parses_back_and_matches_only_its_own_hash() -> None:
    minted = tokens.mint()
    parsed = tokens.parse(minted.plaintext)
    assert parsed is not None and parsed.id == minted.id
    assert tokens.matches(parsed.secret, minted.secret_hash)
    assert not tokens.matches(parsed.secret + "x", minted.secret_hash)
    assert minted.secret_hash != parsed.secret  # only the digest would be stored


@pytest.mark.parametrize(
    "presented", ["", "lks_", "lks_abc_def", "bearer", "lks_0123456789abcdef", "x" * 500]
)
def test_foreign_strings_are_not_tokens(presented: str) -> None:
    assert tokens.parse(presented) is None


def test_same_token_compares_whole_tokens() -> None:
    assert tokens.same_token("abc", "abc")
    assert not tokens.same_token("abc", "abd")


@pytest.mark.parametrize(
    ("running", "capacity", "pending", "expected"),
    [
        (0, 0, 0, 0.0),  # no fleet, no work
        (0, 0, 5, 1.0),  # no fleet, work waiting: saturated
        (2, 4, 0, 0.5),
        (4, 4, 9, 1.0),
        (6, 4, 0, 1.0),  # over-reported: capped
    ],
)
def test_utilization(running: int, capacity: int, pending: int, expected: float) -> None:
    assert utilization(running=running, capacity=capacity, pending=pending) == expected
