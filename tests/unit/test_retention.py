"""Retention's pure rules: each queue's cutoff (its own window, else the server's), the
events' two cutoffs, and the bounds of a sweep's batches."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from lakeshore.config import Settings
from lakeshore.domain import retention
from lakeshore.domain.queue import parse_spec
from lakeshore.errors import InvalidInput

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
DAY = 86_400.0


def test_a_queue_without_its_own_window_takes_the_servers() -> None:
    cutoffs = retention.queue_cutoffs(NOW, {"q1": None, "q2": 60.0}, 7 * DAY)

    assert cutoffs == {"q1": NOW - timedelta(days=7), "q2": NOW - timedelta(seconds=60)}


def test_a_queue_window_longer_than_the_servers_wins_too() -> None:
    cutoffs = retention.queue_cutoffs(NOW, {"long": 30 * DAY}, 7 * DAY)

    assert cutoffs == {"long": NOW - timedelta(days=30)}


@pytest.mark.parametrize(
    ("event_s", "noop_s", "every", "noops"),
    [
        (7 * DAY, DAY, timedelta(days=7), timedelta(days=1)),  # no-ops go sooner
        (DAY, 7 * DAY, timedelta(days=1), timedelta(days=1)),  # never later than events
        (60.0, 60.0, timedelta(seconds=60), timedelta(seconds=60)),
    ],
)
def test_event_cutoffs_noops_go_at_the_sooner_window(
    event_s: float, noop_s: float, every: timedelta, noops: timedelta
) -> None:
    assert retention.event_cutoffs(NOW, event_s, noop_s) == (NOW - every, NOW - noops)


@pytest.mark.parametrize(
    ("last_deleted", "batches_done", "more"),
    [
        (1_000, 0, True),  # nothing done yet: start
        (1_000, 1, True),  # a full batch: there may be more
        (999, 1, False),  # a short batch found all there was
        (0, 1, False),
        (1_000, 1_000, False),  # the sweep's cap: the next sweep goes on
    ],
)
def test_a_sweep_deletes_full_batches_until_one_comes_back_short_or_the_cap(
    last_deleted: int, batches_done: int, more: bool
) -> None:
    assert retention.more_batches(last_deleted, batches_done) is more


def test_batch_bounds_can_be_given() -> None:
    assert retention.more_batches(2, 1, batch_rows=2, max_batches=3)
    assert not retention.more_batches(2, 3, batch_rows=2, max_batches=3)


def test_deleted_counts_by_metric_kind() -> None:
    deleted = retention.Deleted(invocations=3, stream_items=7, events=1)

    assert deleted.as_counts() == {"invocations": 3, "stream_items": 7, "events": 1}


def test_a_queue_takes_a_retention_window_in_seconds() -> None:
    spec = parse_spec({"name": "q", "retention_s": 60})

    assert spec.retention_s == 60
    assert spec.to_json()["retention_s"] == 60


@pytest.mark.parametrize("bad", [0, -1, "60", True, retention.MAX_RETENTION_S + 1])
def test_a_bad_retention_window_is_refused_naming_the_field(bad: object) -> None:
    with pytest.raises(InvalidInput) as refused:
        parse_spec({"name": "q", "retention_s": bad})

    assert refused.value.field == "retention_s"


def test_the_server_keeps_finished_work_and_events_a_week_and_sweeps_every_minute() -> None:
    settings = Settings(database_url="sqlite:///x.db")

    assert (settings.retention_s, settings.event_retention_s) == (7 * DAY, 7 * DAY)
    assert settings.retention_interval_s == 60


@pytest.mark.parametrize(
    "given",
    [
        {"retention_s": 0},
        {"event_retention_s": -1},
        {"retention_s": retention.MAX_RETENTION_S + 1},
        {"retention_interval_s": 0.01},  # 0 (never) or at least the loops' floor
    ],
)
def test_bad_retention_settings_are_refused(given: dict[str, float]) -> None:
    with pytest.raises(ValidationError):
        Settings(database_url="sqlite:///x.db", **given)


@pytest.mark.parametrize(
    ("batch_s", "pause_s"), [(0.0, 0.0), (0.05, 0.2), (0.25, 1.0), (5.0, 2.0), (-1.0, 0.0)]
)
def test_after_a_batch_the_sweep_pauses_four_times_as_long_at_most_two_seconds(
    batch_s: float, pause_s: float
) -> None:
    assert retention.pause_after(batch_s) == pause_s
