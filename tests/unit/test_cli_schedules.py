"""``lakeshore schedules``' own parsing: --every's durations."""

from __future__ import annotations

import pytest
import typer

from lakeshore.cli.schedules import parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("2.5", 2.5), ("30s", 30), ("5m", 300), ("1h30m", 5400), ("1d", 86400),
     ("1D", 86400), (" 2h ", 7200), ("1.5h", 5400)],
)  # fmt: skip
def test_a_duration_in_seconds_or_units(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "5 m", "5x", "m5", "1h-", "h"])
def test_anything_else_is_refused_naming_the_flag(text: str) -> None:
    with pytest.raises(typer.BadParameter) as caught:
        parse_duration(text)
    assert "is not a duration" in str(caught.value)
