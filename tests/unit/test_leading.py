"""The loop that takes the cluster's housekeeping (services/leading.py): it looks every
interval, keeps going through a failed look, and says when the duty changes hands;
sleeps are given, not waited for."""

from __future__ import annotations

import asyncio
import logging

import pytest

from lakeshore.services import leading


class Flipping:
    """Leads on the second and third looks; the fourth look fails."""

    def __init__(self) -> None:
        self.looks = 0

    async def try_lead(self) -> bool:
        self.looks += 1
        if self.looks == 4:
            raise ConnectionError("the database went away")
        return self.looks in (2, 3)

    @property
    def leading(self) -> bool:
        return self.looks in (2, 3)

    async def release(self) -> None:
        return None


async def test_it_looks_every_interval_through_failures_and_logs_each_change(
    caplog: pytest.LogCaptureFixture,
) -> None:
    leadership = Flipping()
    sleeps: list[float] = []

    async def six_sleeps(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 6:
            raise asyncio.CancelledError

    caplog.set_level(logging.INFO, "lakeshore.leadership")
    with pytest.raises(asyncio.CancelledError):
        await leading.run_forever(leadership, 5.0, sleep=six_sleeps)

    assert leadership.looks == 5 and sleeps == [5.0] * 6  # a sleep before each look
    said = [r.getMessage() for r in caplog.records]
    assert said[0] == "this server does the cluster's housekeeping"  # the second look
    assert "looking for the housekeeping lead failed" in said[1]  # the fourth
    assert said[2] == "this server no longer does the cluster's housekeeping"  # the fifth
    assert len(said) == 3
