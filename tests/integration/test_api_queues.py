"""Queue records over HTTP, on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from lakeshore.store.engine import Store
from tests.conftest import FakeClock
from tests.integration.helpers import insert_invocation

QUEUES = "/v1/namespaces/default/queues"


async def create(api: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    response = await api.post(QUEUES, json=body)
    assert response.status_code == 201, response.text
    return dict(response.json())


async def test_create_returns_the_full_record(api: httpx.AsyncClient, clock: FakeClock) -> None:
    queue = await create(
        api,
        name="gpu-train",
        kind="priority",
        providerRef="aws-east",
        elasticity={"kind": "fully_elastic", "min": 0, "max": 4},
    )
    assert queue["name"] == "gpu-train"
    assert queue["kind"] == "priority"
    assert queue["state"] == "active"
    assert queue["id"].startswith("q_")
    assert queue["namespaceId"].startswith("ns_")
    assert queue["createdAt"] == queue["updatedAt"] == clock.now.isoformat()
    got = await api.get(f"{QUEUES}/gpu-train")
    assert got.status_code == 200
    assert got.json() == queue


async def test_a_duplicate_name_is_a_conflict(api: httpx.AsyncClient) -> None:
    await create(api, name="gpu")
    again = await api.post(QUEUES, json={"name": "gpu", "kind": "filo"})
    assert again.status_code == 409
    assert again.json()["error"] == {
        "code": "conflict",
        "message": 'queue "gpu" already exists in this namespace',
        "field": "name",
    }


async def test_the_same_name_in_two_namespaces_is_two_queues(api: httpx.AsyncClient) -> None:
    assert (await api.post("/v1/namespaces", json={"name": "team-b"})).status_code == 201
    first = await create(api, name="gpu")
    second = (await api.post("/v1/namespaces/team-b/queues", json={"name": "gpu"})).json()
    assert first["id"] != second["id"]
    assert first["namespaceId"] != second["namespaceId"]


@pytest.mark.parametrize(
    ("kind", "underscored"),
    [
        ("fully-elastic", "fully_elastic"),
        ("pool-with-threshold", "pool_with_threshold"),
        ("max-count", "max_count"),
    ],
)
async def test_hyphenated_elasticity_kinds_are_refused_over_http(
    api: httpx.AsyncClient, kind: str, underscored: str
) -> None:
    response = await api.post(QUEUES, json={"name": "q", "elasticity": {"kind": kind}})
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert error["field"] == "elasticity.kind"
    assert f'"{underscored}"' in error["message"]
    assert (await api.get(f"{QUEUES}/q")).status_code == 404


async def test_validation_errors_name_the_field(api: httpx.AsyncClient) -> None:
    response = await api.post(
        QUEUES, json={"name": "q", "elasticity": {"kind": "fixed", "min": 3, "max": 1}}
    )
    assert response.status_code == 422
    assert response.json()["error"]["field"] == "elasticity.max"


async def test_unknown_elasticity_keys_survive_a_round_trip(api: httpx.AsyncClient) -> None:
    await create(api, name="q", elasticity={"kind": "fully_elastic", "future_knob": {"a": [1, 2]}})
    stored = (await api.get(f"{QUEUES}/q")).json()
    assert stored["elasticity"] == {"kind": "fully_elastic", "future_knob": {"a": [1, 2]}}


async def test_patch_replaces_nested_objects_whole_and_bumps_updated_at(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    await create(
        api,
        name="q",
        kind="priority",
        elasticity={"kind": "fully_elastic", "min": 1, "max": 4, "pool": "p"},
    )
    clock.advance(30)
    response = await api.patch(f"{QUEUES}/q", json={"elasticity": {"kind": "max_count", "max": 8}})
    assert response.status_code == 200
    patched = response.json()
    assert patched["elasticity"] == {"kind": "max_count", "max": 8}
    assert patched["kind"] == "priority"
    assert patched["updatedAt"] == clock.now.isoformat()
    assert patched["createdAt"] != patched["updatedAt"]
    assert (await api.get(f"{QUEUES}/q")).json() == patched


async def test_patch_with_null_clears_a_field(api: httpx.AsyncClient) -> None:
    await create(api, name="q", providerRef="aws", description="d")
    patched = (await api.patch(f"{QUEUES}/q", json={"providerRef": None})).json()
    assert "providerRef" not in patched
    assert patched["description"] == "d"


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"name": "renamed"}, 422, "name"),
        ({"state": "paused"}, 422, "state"),
        ({"elasticity": {"kind": "fully-elastic"}}, 422, "elasticity.kind"),
        ({"bogus": 1}, 422, "bogus"),
        (["not", "an", "object"], 422, None),
    ],
)
async def test_a_refused_patch_changes_nothing(
    api: httpx.AsyncClient, body: Any, status: int, field: str | None
) -> None:
    before = await create(api, name="q", kind="filo")
    response = await api.patch(f"{QUEUES}/q", json=body)
    assert response.status_code == status
    assert response.json()["error"].get("field") == field
    assert (await api.get(f"{QUEUES}/q")).json() == before


async def test_patch_and_get_of_a_missing_queue_are_404(api: httpx.AsyncClient) -> None:
    for response in (
        await api.get(f"{QUEUES}/nope"),
        await api.patch(f"{QUEUES}/nope", json={"kind": "filo"}),
        await api.post(f"{QUEUES}/nope/drain"),
        await api.get(f"{QUEUES}/nope/stats"),
    ):
        assert response.status_code == 404
        assert response.json()["error"]["message"] == 'queue "nope" not found'


async def test_list_is_sorted_and_hides_archived_unless_asked(api: httpx.AsyncClient) -> None:
    for name in ("c", "a", "b"):
        await create(api, name=name)
    assert (await api.post(f"{QUEUES}/b/archive")).status_code == 200
    listed = (await api.get(QUEUES)).json()["queues"]
    assert [q["name"] for q in listed] == ["a", "c"]
    everything = (await api.get(QUEUES, params={"include_archived": "true"})).json()["queues"]
    assert [q["name"] for q in everything] == ["a", "b", "c"]


LIFECYCLE = [
    # (transitions applied in order, expected final state)
    (["drain"], "draining"),
    (["pause"], "paused"),
    (["pause", "resume"], "active"),
    (["drain", "resume"], "active"),
    (["drain", "pause"], "paused"),
    (["pause", "drain"], "draining"),
    (["archive"], "archived"),
    (["drain", "archive"], "archived"),
    (["pause", "archive"], "archived"),
    (["archive", "unarchive"], "active"),
    (["drain", "unarchive"], "active"),
    (["pause", "unarchive"], "active"),
    (["drain", "drain"], "draining"),
    (["archive", "archive"], "archived"),
    (["resume"], "active"),
    (["unarchive"], "active"),
]


@pytest.mark.parametrize(("steps", "final"), LIFECYCLE, ids=["-".join(s) for s, _ in LIFECYCLE])
async def test_lifecycle_transitions(api: httpx.AsyncClient, steps: list[str], final: str) -> None:
    await create(api, name="q")
    for step in steps:
        response = await api.post(f"{QUEUES}/q/{step}")
        assert response.status_code == 200, response.text
    assert response.json()["state"] == final
    assert (await api.get(f"{QUEUES}/q")).json()["state"] == final


@pytest.mark.parametrize("action", ["drain", "pause", "resume"])
async def test_an_archived_queue_refuses_transitions_but_unarchive(
    api: httpx.AsyncClient, action: str
) -> None:
    await create(api, name="q")
    await api.post(f"{QUEUES}/q/archive")
    response = await api.post(f"{QUEUES}/q/{action}")
    assert response.status_code == 409
    assert "unarchive" in response.json()["error"]["message"]
    assert (await api.get(f"{QUEUES}/q")).json()["state"] == "archived"


async def test_an_archived_queue_is_read_only(api: httpx.AsyncClient) -> None:
    await create(api, name="q")
    await api.post(f"{QUEUES}/q/archive")
    response = await api.patch(f"{QUEUES}/q", json={"kind": "filo"})
    assert response.status_code == 409
    assert (await api.get(f"{QUEUES}/q")).json()["kind"] == "fifo"


async def test_an_archived_name_cannot_be_created_again(api: httpx.AsyncClient) -> None:
    await create(api, name="q")
    await api.post(f"{QUEUES}/q/archive")
    response = await api.post(QUEUES, json={"name": "q"})
    assert response.status_code == 409
    assert "unarchive" in response.json()["error"]["message"]


async def test_archiving_a_queue_with_open_work_is_refused(
    api: httpx.AsyncClient, store: Store, clock: FakeClock
) -> None:
    queue = await create(api, name="q")
    await insert_invocation(store, queue, state="pending", now=clock.now)
    await insert_invocation(store, queue, state="succeeded", now=clock.now)
    response = await api.post(f"{QUEUES}/q/archive")
    assert response.status_code == 409
    assert "1 pending or running invocation" in response.json()["error"]["message"]
    assert (await api.get(f"{QUEUES}/q")).json()["state"] == "active"


async def test_stats_of_a_new_queue_are_zero(api: httpx.AsyncClient) -> None:
    await create(api, name="q")
    stats = (await api.get(f"{QUEUES}/q/stats")).json()
    assert stats["pending"] == stats["running"] == stats["daemonCount"] == stats["inFlight"] == 0
    assert stats["utilization"] == 0.0
    assert set(stats["byState"]) == {
        "pending",
        "running",
        "succeeded",
        "failed",
        "cancelled",
        "expired",
    }


async def test_stats_count_invocations_by_state(
    api: httpx.AsyncClient, store: Store, clock: FakeClock
) -> None:
    queue = await create(api, name="q")
    for state in ("pending", "pending", "running", "failed"):
        await insert_invocation(store, queue, state=state, now=clock.now)
    stats = (await api.get(f"{QUEUES}/q/stats")).json()
    assert (stats["pending"], stats["running"], stats["byState"]["failed"]) == (2, 1, 1)
    assert stats["utilization"] == 1.0  # work waiting, no capacity


async def test_demo_queue_is_created_at_start_when_asked(settings: Any, clock: FakeClock) -> None:
    from asgi_lifespan import LifespanManager

    from lakeshore.api.app import create_app
    from tests.conftest import ADMIN

    app = create_app(settings, clock=clock, demo=True)
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://t", headers=ADMIN
        ) as api:
            demo = (await api.get(f"{QUEUES}/demo")).json()
    assert demo["elasticity"] == {"kind": "fully_elastic", "min": 0, "max": 4}


async def test_names_no_queue_could_have_are_plain_404s(api: httpx.AsyncClient) -> None:
    for path in (f"{QUEUES}/a%00b", f"{QUEUES}/{'x' * 300}", "/v1/namespaces/a%00b/queues"):
        response = await api.get(path)
        assert response.status_code == 404, path


async def test_a_description_with_nul_is_422_on_every_store(api: httpx.AsyncClient) -> None:
    response = await api.post(QUEUES, json={"name": "q", "description": "a\x00b"})
    assert response.status_code == 422
    assert response.json()["error"]["field"] == "description"


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded"])
async def test_a_queue_body_that_is_not_json_is_415(
    api: httpx.AsyncClient, content_type: str
) -> None:
    for method, url in (("POST", QUEUES), ("PATCH", f"{QUEUES}/q")):
        response = await api.request(
            method, url, content=b'{"name": "q"}', headers={"content-type": content_type}
        )
        assert response.status_code == 415
        assert response.json()["error"]["code"] == "unsupported_media_type"
    assert (await api.get(f"{QUEUES}/q")).status_code == 404


async def test_json_with_a_charset_is_json(api: httpx.AsyncClient) -> None:
    response = await api.post(
        QUEUES,
        content=b'{"name": "q"}',
        headers={"content-type": "application/json; charset=utf-8"},
    )
    assert response.status_code == 201
