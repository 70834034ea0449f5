"""The pure rules of periodic schedules: validation, slots (cron with seconds, time zones
and DST, every_s), catch_up and its bound per tick."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from lakeshore.domain import schedules
from lakeshore.errors import InvalidInput


def t(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


def spec(**fields: Any) -> schedules.ScheduleSpec:
    return schedules.parse({"name": "nightly", "fn": "jobs:run", **fields})


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"cron": "* * *"}, "cron"),
        ({"cron": "61 * * * *"}, "cron"),
        ({"cron": "* * * * * * *"}, "cron"),
        ({"cron": "not a cron at all"}, "cron"),
        ({}, "cron"),
        ({"cron": "* * * * *", "every_s": 60}, "cron"),
        ({"every_s": 0.5}, "every_s"),
        ({"every_s": 10**9}, "every_s"),
        ({"every_s": "60"}, "every_s"),
        ({"every_s": 60, "timezone": "Mars/Olympus"}, "timezone"),
        ({"every_s": 60, "timezone": "../../etc/passwd"}, "timezone"),
        ({"every_s": 60, "catch_up": "some"}, "catch_up"),
        ({"every_s": 60, "fn": "no-colon"}, "fn"),
        ({"every_s": 60, "name": "Bad Name"}, "name"),
        ({"every_s": 60, "args": {"a": 1}}, "args"),
        ({"every_s": 60, "surprise": 1}, "surprise"),
    ],
)
def test_a_bad_schedule_is_refused_naming_its_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        schedules.parse({"name": "nightly", "fn": "jobs:run", **body})
    assert caught.value.field == field


def test_a_schedule_takes_its_defaults() -> None:
    parsed = spec(cron="0 3 * * *")
    assert (parsed.timezone, parsed.catch_up, parsed.enabled) == ("UTC", "one", True)
    assert parsed.to_json()["kwargs"] == {}


@pytest.mark.parametrize(
    ("fields", "after", "expected"),
    [
        # 5 fields: minutes
        ({"cron": "*/15 * * * *"}, "2026-12-07T13:01:00+00:00", "2026-12-07T13:15:00+00:00"),
        # 6 fields: seconds first
        ({"cron": "*/10 * * * * *"}, "2026-12-07T13:00:01+00:00", "2026-12-07T13:00:10+00:00"),
        ({"cron": "30 0 12 * * *"}, "2026-12-07T11:00:00+00:00", "2026-12-07T12:00:30+00:00"),
        # a time zone's wall clock
        (
            {"cron": "0 9 * * *", "timezone": "Europe/Paris"},
            "2026-12-07T00:00:00+00:00",
            "2026-12-07T08:00:00+00:00",
        ),
        (
            {"cron": "0 9 * * *", "timezone": "Europe/Paris"},
            "2026-07-07T00:00:00+00:00",
            "2026-07-07T07:00:00+00:00",
        ),
        # spring forward in Berlin: 02:30 does not exist on 2026-03-29, 03:00 CEST instead
        (
            {"cron": "30 2 * * *", "timezone": "Europe/Berlin"},
            "2026-03-28T12:00:00+00:00",
            "2026-03-29T01:00:00+00:00",
        ),
        # the day after, 02:30 CEST again
        (
            {"cron": "30 2 * * *", "timezone": "Europe/Berlin"},
            "2026-03-29T12:00:00+00:00",
            "2026-03-30T00:30:00+00:00",
        ),
        # every_s: multiples of the interval since the epoch
        ({"every_s": 2}, "2026-12-07T13:00:01.500000+00:00", "2026-12-07T13:00:02+00:00"),
        ({"every_s": 2}, "2026-12-07T13:00:02+00:00", "2026-12-07T13:00:04+00:00"),
        ({"every_s": 3600}, "2026-12-07T13:20:00+00:00", "2026-12-07T14:00:00+00:00"),
        ({"every_s": 1.5}, "1970-01-01T00:00:01+00:00", "1970-01-01T00:00:01.500000+00:00"),
    ],
)
def test_the_next_slot(fields: dict[str, Any], after: str, expected: str) -> None:
    assert schedules.next_slot(spec(**fields), t(after)) == t(expected)


def test_a_repeated_wall_hour_in_the_fall_is_two_slots_an_hour_apart() -> None:
    nightly = spec(cron="30 1 * * *", timezone="America/New_York")
    first = schedules.next_slot(nightly, t("2026-10-31T12:00:00+00:00"))
    second = schedules.next_slot(nightly, first)
    assert (first, second) == (t("2026-11-01T05:30:00+00:00"), t("2026-11-01T06:30:00+00:00"))


@pytest.mark.parametrize(
    ("fields", "at", "expected"),
    [
        (
            {"cron": "*/10 * * * * *"},
            "2026-01-01T00:00:25.000005+00:00",
            "2026-01-01T00:00:20+00:00",
        ),
        ({"cron": "*/10 * * * * *"}, "2026-01-01T00:00:20+00:00", "2026-01-01T00:00:20+00:00"),
        ({"cron": "0 * * * *"}, "2026-01-01T00:59:59.9+00:00", "2026-01-01T00:00:00+00:00"),
        ({"every_s": 2}, "2026-01-01T00:00:03.9+00:00", "2026-01-01T00:00:02+00:00"),
        ({"every_s": 2}, "2026-01-01T00:00:04+00:00", "2026-01-01T00:00:04+00:00"),
    ],
)
def test_the_latest_slot_counts_one_at_now(fields: dict[str, Any], at: str, expected: str) -> None:
    assert schedules.latest_slot(spec(**fields), t(at)) == t(expected)


BASE = t("2026-12-07T13:00:00+00:00")


def at(seconds: float) -> datetime:
    return BASE + timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("catch_up", "after", "now", "slots", "last", "skipped"),
    [
        # on time, nothing missed: the one due slot, whatever catch_up says
        ("none", 0, 2.3, [2], 2, 0),
        ("one", 0, 2.3, [2], 2, 0),
        ("all", 0, 2.3, [2], 2, 0),
        # nothing due yet
        ("all", 2, 3.9, [], 2, 0),
        ("one", 2, 2, [], 2, 0),
        # a gap of 5 slots, the latest on time: none and one take the latest
        ("none", 0, 10.5, [10], 10, 0),
        ("one", 0, 10.5, [10], 10, 0),
        ("all", 0, 10.5, [2, 4, 6, 8, 10], 10, 0),
    ],
)
def test_catch_up(
    catch_up: str, after: float, now: float, slots: list[float], last: float, skipped: int
) -> None:
    every_two = spec(every_s=2, catch_up=catch_up)
    got = schedules.due(every_two, at(after), at(now))
    assert got == schedules.Due(tuple(at(s) for s in slots), at(last), skipped)


@pytest.mark.parametrize(
    ("catch_up", "slots", "skipped"),
    [("none", [], 1), ("one", [3600], 0), ("all", [600 * i for i in range(1, 7)], 0)],
)
def test_catch_up_when_even_the_latest_slot_was_missed(
    catch_up: str, slots: list[float], skipped: int
) -> None:
    every_ten_minutes = spec(every_s=600, catch_up=catch_up)
    got = schedules.due(every_ten_minutes, at(0), at(3600 + schedules.ON_TIME_S + 1))
    assert got == schedules.Due(tuple(at(s) for s in slots), at(3600), skipped)


def test_catch_up_all_is_bounded_per_tick_and_resumes_oldest_first() -> None:
    every_two = spec(every_s=2, catch_up="all")
    first = schedules.due(every_two, at(0), at(1000), limit=100)
    assert first.slots == tuple(at(2 * i) for i in range(1, 101))
    second = schedules.due(every_two, first.last, at(1000), limit=100)
    assert second.slots == tuple(at(2 * i) for i in range(101, 201))
    rest = schedules.due(every_two, second.last, at(1000), limit=1000)
    assert rest.slots[0] == at(402) and rest.slots[-1] == at(1000) and len(rest.slots) == 300


def test_catch_up_all_with_cron_and_seconds() -> None:
    every_ten = spec(cron="*/10 * * * * *", catch_up="all")
    got = schedules.due(every_ten, at(0), at(35))
    assert got.slots == (at(10), at(20), at(30))


def test_a_paused_schedule_enqueues_nothing_and_skips_what_falls_due() -> None:
    paused = spec(every_s=2, catch_up="all", enabled=False)
    assert schedules.due(paused, at(0), at(20)) == schedules.Due((), at(20))
    assert schedules.upcoming(paused, at(0), at(20)) is None


def test_upcoming_is_the_oldest_owed_slot_with_all_else_the_next_after_now() -> None:
    assert schedules.upcoming(spec(every_s=2, catch_up="all"), at(0), at(9)) == at(2)
    assert schedules.upcoming(spec(every_s=2, catch_up="one"), at(0), at(9)) == at(10)


def test_slot_keys_are_rfc3339_in_utc_and_differ_per_schedule() -> None:
    slot = t("2026-12-07T14:00:00+01:00")
    assert schedules.slot_text(slot) == "2026-12-07T13:00:00Z"
    assert schedules.slot_key("nightly", slot) == "schedule:nightly:2026-12-07T13:00:00Z"
    assert schedules.slot_key("other", slot) != schedules.slot_key("nightly", slot)


def test_a_patch_switches_between_cron_and_every_s() -> None:
    every = schedules.patched(spec(cron="0 * * * *"), {"every_s": 30})
    assert (every.cron, every.every_s) == (None, 30)
    back = schedules.patched(every, {"cron": "0 * * * *", "catch_up": "all"})
    assert (back.cron, back.every_s, back.catch_up) == ("0 * * * *", None, "all")
    with pytest.raises(InvalidInput) as caught:
        schedules.patched(every, {"name": "renamed"})
    assert caught.value.field == "name"
