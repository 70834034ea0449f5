"""Delayed submits, the pure rules: a submit's due time from ``delay_s`` or
``not_before`` at a given ``now``, and the bounds (one or the other, at most a year)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from lakeshore.domain.invocations import MAX_DELAY_S, due_at, parse_submit, parse_time
from lakeshore.errors import InvalidInput

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
F = {"fn": "m:f"}


@pytest.mark.parametrize(
    ("extra", "due"),
    [
        ({}, NOW),
        ({"delay_s": 0}, NOW),
        ({"delay_s": 30}, NOW + timedelta(seconds=30)),
        ({"delay_s": 0.25}, NOW + timedelta(milliseconds=250)),
        ({"delay_s": MAX_DELAY_S}, NOW + timedelta(days=365)),
        ({"not_before": "2026-03-01T12:00:30Z"}, NOW + timedelta(seconds=30)),
        ({"not_before": "2026-03-01T14:00:30+02:00"}, NOW + timedelta(seconds=30)),
        ({"not_before": "2026-03-01t12:00:30.5z"}, NOW + timedelta(seconds=30.5)),
        ({"not_before": "2026-03-01 12:00:30+00:00"}, NOW + timedelta(seconds=30)),
        # passed already: due now, not in the past
        ({"not_before": "2025-01-01T00:00:00Z"}, NOW),
        # exactly a year ahead is within the bound
        ({"not_before": "2027-03-01T12:00:00Z"}, NOW + timedelta(days=365)),
    ],
)
def test_a_submit_falls_due_at(extra: dict[str, object], due: datetime) -> None:
    assert due_at(parse_submit({**F, **extra}), NOW) == due


def test_a_due_time_given_with_an_offset_is_the_same_instant() -> None:
    got = due_at(parse_submit({**F, "not_before": "2026-03-01T07:00:30-05:00"}), NOW)
    assert got == NOW + timedelta(seconds=30)
    assert got.utcoffset() == timezone(timedelta(hours=-5)).utcoffset(None)


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"delay_s": -1}, "greater than or equal to 0"),
        ({"delay_s": MAX_DELAY_S + 1}, "less than or equal to"),
        ({"delay_s": "30"}, "delay_s"),
        ({"delay_s": True}, "delay_s"),
        ({"not_before": "2026-03-01T12:00:30"}, "offset"),
        ({"not_before": "2026-03-01T12:00:30.000"}, "no offset"),
        ({"not_before": "2026-03-01"}, "RFC 3339"),
        ({"not_before": "tomorrow"}, "RFC 3339"),
        ({"not_before": "2026-13-01T12:00:00Z"}, "RFC 3339"),
        ({"not_before": 1767225600}, "not_before"),
    ],
)
def test_a_delay_out_of_bounds_is_refused_naming_it(extra: dict[str, object], words: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        parse_submit({**F, **extra})
    assert words in str(refused.value)


def test_a_delay_and_a_time_together_are_refused() -> None:
    submit = parse_submit({**F, "delay_s": 30, "not_before": "2026-03-01T12:00:30Z"})
    with pytest.raises(InvalidInput) as refused:
        due_at(submit, NOW, where="invocations[2]")
    assert refused.value.field == "invocations[2]"
    assert "not both" in str(refused.value)


def test_a_time_more_than_a_year_ahead_is_refused_at_its_submit() -> None:
    submit = parse_submit({**F, "not_before": "2027-03-01T12:00:01Z"})
    with pytest.raises(InvalidInput) as refused:
        due_at(submit, NOW, where="invocations[3]")
    assert refused.value.field == "invocations[3].not_before"
    assert "more than a year" in str(refused.value)


@pytest.mark.parametrize(
    "text", ["2026-03-01T12:00:00Z", "2026-03-01T13:00:00+01:00", "2026-03-01T12:00:00.000001Z"]
)
def test_rfc3339_times_are_read_as_aware_instants(text: str) -> None:
    parsed = parse_time(text)
    assert parsed.tzinfo is not None
    assert abs(parsed - NOW) < timedelta(milliseconds=1)
