"""The lines of ``lakeshore submit --from-file`` (cli/bulk.py): every bad line named by
its number, the good ones read as calls, batches of at most 1,000."""

from __future__ import annotations

import pytest

from lakeshore.cli import bulk


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("[1, 2]", "not a JSON object"),
        ("{nope", "not JSON"),
        ('{"fn": "m:f"}', "unknown field 'fn'"),
        ('{"args": {"a": 1}}', "args must be a list"),
        ('{"kwargs": [1]}', "kwargs must be an object"),
        ('{"key": 7}', "key must be a string"),
        ('{"delay_s": -1}', "delay_s must be a number of seconds >= 0"),
        ('{"delay_s": "5m"}', "delay_s must be a number of seconds >= 0"),
        ('{"max_attempts": 0}', "max_attempts must be an integer >= 1"),
        ('{"timeout_s": 0}', "timeout_s must be a number of seconds > 0"),
        ('{"not_before": 5}', "not_before must be an RFC 3339 time"),
        ('{"delay_s": 1, "not_before": "2030-01-01T00:00:00Z"}', "not both"),
    ],
)
def test_a_bad_line_is_named_with_its_number(line: str, problem: str) -> None:
    calls, bad = bulk.read(['{"args": [1]}', "", line])
    assert [c.line for c in calls] == [1]
    assert len(bad) == 1 and bad[0].startswith("line 3: ") and problem in bad[0]


def test_good_lines_are_calls_and_big_integers_stay_integers() -> None:
    calls, bad = bulk.read(
        [
            '{"args": [18446744073709551617], "kwargs": {"x": 1}, "key": "k1"}',
            "   ",
            '{"delay_s": 30, "max_attempts": 2, "timeout_s": 1.5}',
            "{}",
        ]
    )
    assert bad == []
    assert [c.line for c in calls] == [1, 3, 4]
    assert calls[0].body == {"args": [2**64 + 1], "kwargs": {"x": 1}, "key": "k1"}


def test_batches_of_at_most_a_thousand_keep_the_order() -> None:
    calls, _ = bulk.read(["{}"] * 2_500)
    sizes = [len(b) for b in bulk.batches(calls)]
    assert sizes == [1_000, 1_000, 500]
    assert [c.line for b in bulk.batches(calls) for c in b] == list(range(1, 2_501))


def test_many_bad_lines_are_shown_up_to_a_bound() -> None:
    _, bad = bulk.read(["[]"] * 30)
    assert bulk.shown(bad).splitlines()[-1] == "… and 10 more bad lines"
