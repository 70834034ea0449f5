"""The pure parts of the server's connection limits: the cap a descriptor limit leaves
room for, and the log of a flood kept to a few lines a second (``now`` passed in)."""

from __future__ import annotations

import logging

import pytest

from lakeshore.api import http_protocol
from lakeshore.api.http_protocol import LINES_PER_S, _Lines


@pytest.mark.parametrize(
    ("descriptors", "cap"),
    [(1024, 896), (4096, 3584), (20_000, 17_500), (256, 128), (128, 64), (2, 1)],
)
def test_the_cap_leaves_an_eighth_of_the_descriptors_at_least_128_at_most_half(
    descriptors: int, cap: int
) -> None:
    assert http_protocol.connection_cap(descriptors) == cap


def test_under_1024_descriptors_500_long_polls_fit_with_room_to_spare() -> None:
    assert http_protocol.connection_cap(1024) >= 500 + 256


def test_a_flood_is_logged_10_lines_a_second_and_the_next_line_counts_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lines = _Lines()
    with caplog.at_level(logging.WARNING, logger="lakeshore.http"):
        for n in range(100):
            lines.warn(5.0 + n / 1000, "header_timeout", f"10.0.0.{n}:1", f"closed {n}")
        lines.warn(5.5, "body_timeout", "10.0.0.200:1", "another kind")
        lines.warn(6.2, "header_timeout", "10.0.0.201:1", "a second later")

    records = caplog.records
    assert len(records) == LINES_PER_S + 2
    fields = [record.__dict__ for record in records]  # a log call's extra
    assert [f["client"] for f in fields[:LINES_PER_S]] == [
        f"10.0.0.{n}:1" for n in range(LINES_PER_S)
    ]
    assert fields[-2]["limit"] == "body_timeout"
    assert "suppressed" not in fields[-2]
    last = records[-1]
    assert fields[-1]["suppressed"] == 100 - LINES_PER_S
    assert last.getMessage() == f"a second later ({100 - LINES_PER_S} more like it not logged)"
