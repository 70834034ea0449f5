from __future__ import annotations

import re

import pytest

from lakeshore.domain import ids, tokens
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


def test_a_token_with_an_empty_secret_is_not_a_token() -> None:
    assert tokens.parse("lks_0123456789abcdef_") is None
    assert tokens.parse("lks_0123456789abcdef_s") == tokens.ParsedToken("0123456789abcdef", "s")


def test_a_secret_may_hold_underscores() -> None:
    # token_urlsafe's alphabet has "_": the id ends at the first one
    parsed = tokens.parse("lks_0123456789abcdef_se_cr_et")
    assert parsed == tokens.ParsedToken("0123456789abcdef", "se_cr_et")


def test_a_record_id_is_its_prefix_and_twenty_hex_digits() -> None:
    made = {ids.new_id("q") for _ in range(3)}
    assert len(made) == 3
    assert all(re.fullmatch(r"q_[0-9a-f]{20}", made_id) for made_id in made)


@pytest.mark.parametrize(
    ("running", "capacity", "pending", "expected"),
    [
        (1, 1, 0, 1.0),  # a fleet of one, busy
        (0, 1, 5, 0.0),  # a fleet of one, idle with work waiting: its ratio, not 1.0
        (0, 0, 1, 1.0),  # no fleet and one invocation waiting
    ],
)
def test_utilization_with_the_smallest_fleet_and_backlog(
    running: int, capacity: int, pending: int, expected: float
) -> None:
    assert utilization(running=running, capacity=capacity, pending=pending) == expected
