"""Periodic schedules over HTTP, on SQLite and PostgreSQL, with a fake clock: their
records, the refusals of bad ones, and the leader's step enqueueing each slot once."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from lakeshore.services.taskqueue import schedules as schedule_service
from lakeshore.services.taskqueue.notify import Notifier
from lakeshore.store import schedules as schedule_store
from lakeshore.store.engine import Store
from tests.conftest import FakeClock

QUEUES = "/v1/namespaces/default/queues"
SCHEDULES = f"{QUEUES}/jobs/schedules"


@pytest.fixture
async def jobs(api: httpx.AsyncClient) -> None:
    response = await api.post(QUEUES, json={"name": "jobs"})
    assert response.status_code == 201, response.text


async def create(api: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    response = await api.post(SCHEDULES, json={"fn": "tests.udfs:add", **body})
    assert response.status_code == 201, response.text
    return dict(response.json())


async def invocations(api: httpx.AsyncClient) -> list[dict[str, Any]]:
    response = await api.get(f"{QUEUES}/jobs/invocations", params={"limit": 1000})
    assert response.status_code == 200, response.text
    return sorted(response.json()["invocations"], key=lambda i: i["key"] or "")


async def step(store: Store, clock: FakeClock) -> list[schedule_service.Enqueued]:
    return await schedule_service.enqueue_due(store, Notifier(), clock())


@pytest.mark.usefixtures("jobs")
async def test_create_list_show_patch_delete(api: httpx.AsyncClient, clock: FakeClock) -> None:
    made = await create(api, name="nightly", cron="0 3 * * *", timezone="Europe/Paris", args=[1])
    assert made["queue"] == "jobs"
    assert made["catch_up"] == "one" and made["enabled"] is True
    assert made["next_slot"] == "2026-01-02T02:00:00Z"  # 03:00 in Paris, winter
    assert (await api.get(f"{SCHEDULES}/nightly")).json() == made
    await create(api, name="often", every_s=30)
    listed = (await api.get(SCHEDULES)).json()["schedules"]
    assert [s["name"] for s in listed] == ["nightly", "often"]

    paused = await api.patch(f"{SCHEDULES}/nightly", json={"enabled": False})
    assert paused.status_code == 200, paused.text
    assert paused.json()["enabled"] is False and paused.json()["next_slot"] is None
    switched = await api.patch(f"{SCHEDULES}/nightly", json={"every_s": 60, "enabled": True})
    assert switched.json()["cron"] is None and switched.json()["every_s"] == 60
    assert switched.json()["args"] == [1]  # fields not given are kept

    assert (await api.delete(f"{SCHEDULES}/nightly")).status_code == 204
    assert (await api.get(f"{SCHEDULES}/nightly")).status_code == 404
    assert [s["name"] for s in (await api.get(SCHEDULES)).json()["schedules"]] == ["often"]


@pytest.mark.usefixtures("jobs")
@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"name": "a", "cron": "61 * * * *"}, 422, "cron"),
        ({"name": "a", "cron": "* * *"}, 422, "cron"),
        ({"name": "a"}, 422, "cron"),
        ({"name": "a", "cron": "* * * * *", "every_s": 5}, 422, "cron"),
        ({"name": "a", "every_s": 0}, 422, "every_s"),
        ({"name": "a", "every_s": 1e12}, 422, "every_s"),
        ({"name": "a", "every_s": 5, "timezone": "Nowhere/Land"}, 422, "timezone"),
        ({"name": "a", "every_s": 5, "catch_up": "twice"}, 422, "catch_up"),
        ({"name": "a", "every_s": 5, "fn": "no colon"}, 422, "fn"),
        ({"name": "A B", "every_s": 5}, 422, "name"),
        ({"name": "a", "every_s": 5, "kwargs": [1]}, 422, "kwargs"),
    ],
)
async def test_bad_schedules_are_refused_with_4xx_naming_the_field(
    api: httpx.AsyncClient, body: dict[str, Any], status: int, field: str
) -> None:
    response = await api.post(SCHEDULES, json={"fn": "tests.udfs:add", **body})
    assert response.status_code == status, response.text
    assert response.json()["error"]["field"] == field


@pytest.mark.usefixtures("jobs")
async def test_a_taken_name_an_unknown_queue_and_a_bad_patch(api: httpx.AsyncClient) -> None:
    await create(api, name="a", every_s=5)
    assert (
        await api.post(SCHEDULES, json={"name": "a", "fn": "m:f", "every_s": 5})
    ).status_code == 409
    elsewhere = await api.post(
        f"{QUEUES}/nowhere/schedules", json={"name": "a", "fn": "m:f", "every_s": 5}
    )
    assert elsewhere.status_code == 404
    assert (await api.patch(f"{SCHEDULES}/a", json={"every_s": -1})).status_code == 422
    assert (await api.patch(f"{SCHEDULES}/a", json={"name": "b"})).status_code == 422
    assert (await api.patch(f"{SCHEDULES}/a", json=[1])).status_code == 422
    assert (await api.patch(f"{SCHEDULES}/zz", json={"every_s": 9})).status_code == 404
    assert (await api.delete(f"{SCHEDULES}/zz")).status_code == 404


@pytest.mark.usefixtures("jobs")
async def test_the_leader_step_enqueues_each_slot_once(
    api: httpx.AsyncClient, store: Store, clock: FakeClock
) -> None:
    await create(api, name="tick", every_s=2, args=[1, 2], kwargs={"x": 1})
    assert await step(store, clock) == []  # created at 12:00:00, nothing due yet
    clock.advance(2.5)
    [done] = await step(store, clock)
    assert [s.isoformat() for s in done.slots] == ["2026-01-01T12:00:02+00:00"]
    assert await step(store, clock) == []  # the same now again: nothing twice
    clock.advance(2)
    await step(store, clock)
    made = await invocations(api)
    assert [i["key"] for i in made] == [
        "schedule:tick:2026-01-01T12:00:02Z",
        "schedule:tick:2026-01-01T12:00:04Z",
    ]
    assert all(i["args"] == [1, 2] and i["kwargs"] == {"x": 1} for i in made)
    assert [(i["schedule"], i["slot"]) for i in made] == [
        ("tick", "2026-01-01T12:00:02+00:00"),
        ("tick", "2026-01-01T12:00:04+00:00"),
    ]
    one = (await api.get(f"/v1/namespaces/default/invocations/{made[0]['id']}")).json()
    assert (one["schedule"], one["slot"]) == ("tick", "2026-01-01T12:00:02+00:00")
    plain = await api.post(f"{QUEUES}/jobs/invocations", json={"fn": "tests.udfs:add"})
    assert "schedule" not in plain.json() and "slot" not in plain.json()
    shown = (await api.get(f"{SCHEDULES}/tick")).json()
    assert (shown["last_slot"], shown["next_slot"]) == (
        "2026-01-01T12:00:04Z",
        "2026-01-01T12:00:06Z",
    )


@pytest.mark.usefixtures("jobs")
async def test_a_step_repeated_from_an_older_last_slot_adds_no_invocation(
    api: httpx.AsyncClient, store: Store, clock: FakeClock
) -> None:
    """A leader killed after its submits and before it moved the last slot: the next
    leader submits the same slots again, and their keys answer with the same rows."""
    await create(api, name="tick", every_s=2, catch_up="all")
    clock.advance(6.1)
    await step(store, clock)
    first = await invocations(api)
    patched = await api.patch(f"{SCHEDULES}/tick", json={"enabled": False})
    assert patched.status_code == 200
    # as a crash between the submits and the move of the last slot leaves the row
    async with store.write() as conn:
        [row] = await schedule_store.all_schedules(conn)
        await schedule_store.update_schedule(
            conn,
            row["id"],
            spec=row["spec"],
            enabled=True,
            now=clock(),
            last_slot=row["created_at"],
        )
    [again] = await step(store, clock)
    assert len(again.slots) == 3
    assert await invocations(api) == first
    assert [i["key"][-6:] for i in first] == ["00:02Z", "00:04Z", "00:06Z"]


@pytest.mark.usefixtures("jobs")
@pytest.mark.parametrize(
    ("catch_up", "keys"),
    [
        ("none", ["12:00:10Z"]),
        ("one", ["12:00:10Z"]),
        ("all", ["12:00:02Z", "12:00:04Z", "12:00:06Z", "12:00:08Z", "12:00:10Z"]),
    ],
)
async def test_catch_up_after_a_gap(
    api: httpx.AsyncClient, store: Store, clock: FakeClock, catch_up: str, keys: list[str]
) -> None:
    await create(api, name="tick", every_s=2, catch_up=catch_up)
    clock.advance(10.5)  # no leader for five slots
    await step(store, clock)
    made = await invocations(api)
    assert [i["key"].rsplit("T", 1)[1] for i in made] == keys


@pytest.mark.usefixtures("jobs")
async def test_catch_up_none_skips_a_slot_found_long_after_its_time(
    api: httpx.AsyncClient, store: Store, clock: FakeClock
) -> None:
    await create(api, name="hourly", cron="0 * * * *", catch_up="none")
    clock.advance(3600 + 120)  # the 13:00 slot is two minutes late
    [done] = await step(store, clock)
    assert (done.slots, done.skipped) == ((), 1)
    assert await invocations(api) == []
    clock.advance(3600 - 110)  # 14:00:10: on time
    await step(store, clock)
    assert [i["key"] for i in await invocations(api)] == ["schedule:hourly:2026-01-01T14:00:00Z"]


@pytest.mark.usefixtures("jobs")
async def test_a_paused_schedule_enqueues_nothing_and_resumes_from_now(
    api: httpx.AsyncClient, store: Store, clock: FakeClock
) -> None:
    await create(api, name="tick", every_s=2, catch_up="all", enabled=False)
    clock.advance(10)
    await step(store, clock)
    assert await invocations(api) == []
    await api.patch(f"{SCHEDULES}/tick", json={"enabled": True})
    clock.advance(1)
    await step(store, clock)
    assert await invocations(api) == []  # 12:00:11: the pause's slots are not replayed
    clock.advance(1)
    await step(store, clock)
    assert [i["key"] for i in await invocations(api)] == ["schedule:tick:2026-01-01T12:00:12Z"]


@pytest.mark.usefixtures("jobs")
async def test_a_draining_queue_takes_no_slots(
    api: httpx.AsyncClient, store: Store, clock: FakeClock
) -> None:
    await create(api, name="tick", every_s=2, catch_up="all")
    assert (await api.post(f"{QUEUES}/jobs/drain")).status_code == 200
    clock.advance(4.5)
    [done] = await step(store, clock)
    assert done.slots == ()
    assert await invocations(api) == []


@pytest.mark.usefixtures("jobs")
async def test_stats_and_explain_show_each_schedule_s_next_slot(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    await create(api, name="tick", every_s=2)
    await create(api, name="quiet", cron="0 * * * *", enabled=False)
    expected = [
        {"name": "quiet", "next_slot": None},
        {"name": "tick", "next_slot": "2026-01-01T12:00:02Z"},
    ]
    stats = await api.get(f"{QUEUES}/jobs/stats")
    assert stats.status_code == 200, stats.text
    assert stats.json()["schedules"] == expected
    explained = await api.get(f"{QUEUES}/jobs/explain")
    assert explained.status_code == 200, explained.text
    assert explained.json()["now"]["schedules"] == expected


@pytest.mark.usefixtures("jobs")
async def test_a_new_timing_starts_from_now_and_does_not_replay_the_past(
    api: httpx.AsyncClient, store: Store, clock: FakeClock
) -> None:
    await create(api, name="tick", every_s=3600, catch_up="all")
    clock.advance(1800)
    changed = await api.patch(f"{SCHEDULES}/tick", json={"every_s": 2})
    assert changed.json()["next_slot"] == "2026-01-01T12:30:02Z"
    clock.advance(2.5)
    await step(store, clock)
    assert [i["key"] for i in await invocations(api)] == ["schedule:tick:2026-01-01T12:30:02Z"]


async def test_a_slot_the_queue_refuses_is_kept_for_the_next_step(
    api: httpx.AsyncClient, store: Store, clock: FakeClock
) -> None:
    full_at_one = {"name": "jobs", "admission": {"max_depth": 1, "on_full": "reject"}}
    assert (await api.post(QUEUES, json=full_at_one)).status_code == 201
    await create(api, name="tick", every_s=2, catch_up="all")
    clock.advance(4.5)
    [done] = await step(store, clock)  # 12:00:02 goes in, 12:00:04 finds the queue full
    assert [s.isoformat()[11:19] for s in done.slots] == ["12:00:02"]
    assert (await api.get(f"{SCHEDULES}/tick")).json()["last_slot"] == "2026-01-01T12:00:02Z"
    [first] = await invocations(api)
    cancelled = await api.post(f"/v1/namespaces/default/invocations/{first['id']}/cancel")
    assert cancelled.status_code == 200, cancelled.text
    await step(store, clock)
    assert [i["key"][-9:] for i in await invocations(api)] == ["12:00:02Z", "12:00:04Z"]
