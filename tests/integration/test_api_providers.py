"""Provider registrations over HTTP, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import pytest

from lakeshore.providers import KINDS
from lakeshore.providers.base import Kind, register
from lakeshore.providers.fake import FakeConfig, FakeProvider
from lakeshore.store import launches as launch_store
from lakeshore.store import providers as provider_store
from lakeshore.store.engine import Store
from tests.conftest import FakeClock

PROVIDERS = "/v1/namespaces/{ns}/providers"
DEFAULT = PROVIDERS.format(ns="default")
QUEUES = "/v1/namespaces/default/queues"


async def add(api: httpx.AsyncClient, ns: str = "default", **body: Any) -> dict[str, Any]:
    response = await api.post(PROVIDERS.format(ns=ns), json=body)
    assert response.status_code == 201, response.text
    return dict(response.json())


async def namespace_token(api: httpx.AsyncClient, ns: str) -> dict[str, str]:
    if ns != "default":
        assert (await api.post("/v1/namespaces", json={"name": ns})).status_code == 201
    issued = await api.post(f"/v1/namespaces/{ns}/tokens", json={"name": "ci"})
    assert issued.status_code == 201, issued.text
    return {"Authorization": f"Bearer {issued.json()['token']}"}


async def namespace_id(api: httpx.AsyncClient, ns: str = "default") -> str:
    found = (await api.get("/v1/namespaces")).json()["namespaces"]
    return str(next(n["id"] for n in found if n["name"] == ns))


async def test_create_list_get_delete_round_trip(api: httpx.AsyncClient, clock: FakeClock) -> None:
    created = await add(api, name="dry", kind="fake", config={"launch_ttl_s": 30})
    assert created == {
        "name": "dry",
        "kind": "fake",
        "config": {"launch_ttl_s": 30.0, "hang_s": 0.0},  # defaults filled in, no nulls
        "createdAt": clock.now.isoformat(),
        "updatedAt": clock.now.isoformat(),
    }
    await add(api, name="batch", kind="slurm", config={"partition": "gpu"})
    listed = (await api.get(DEFAULT)).json()["providers"]
    assert [p["name"] for p in listed] == ["batch", "dry"]
    assert listed[0]["config"] == {"partition": "gpu"}
    got = await api.get(f"{DEFAULT}/dry")
    assert got.status_code == 200
    assert got.json() == created

    removed = await api.delete(f"{DEFAULT}/dry")
    assert removed.status_code == 200
    assert removed.json() == created
    assert (await api.get(f"{DEFAULT}/dry")).status_code == 404
    assert (await api.delete(f"{DEFAULT}/dry")).status_code == 404
    assert [p["name"] for p in (await api.get(DEFAULT)).json()["providers"]] == ["batch"]


async def test_config_defaults_to_an_empty_object(api: httpx.AsyncClient) -> None:
    assert (await add(api, name="a", kind="ssh"))["config"] == {}
    assert (await add(api, name="b", kind="fake", config=None))["config"]["launch_ttl_s"] == 15.0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "p", "kind": "nope"}, "kind"),
        ({"name": "p", "kind": 7}, "kind"),
        ({"name": "p"}, "kind"),
        ({"kind": "fake"}, "name"),
        ({"name": "Not A Name", "kind": "fake"}, "name"),
        ({"name": "p", "kind": "fake", "config": [1, 2]}, "config"),
        ({"name": "p", "kind": "fake", "config": "launch_ttl_s=1"}, "config"),
        ({"name": "p", "kind": "fake", "config": {"nope": 1}}, "config.nope"),
        ({"name": "p", "kind": "fake", "config": {"launch_ttl_s": -1}}, "config.launch_ttl_s"),
        ({"name": "p", "kind": "fake", "config": {"launch_ttl_s": 0}}, "config.launch_ttl_s"),
        ({"name": "p", "kind": "fake", "config": {"hang_s": "1"}}, "config.hang_s"),
        ({"name": "p", "kind": "fake", "config": {"fail_launch": ""}}, "config.fail_launch"),
        ({"name": "p", "kind": "fake", "extra": 1}, "extra"),
        ({"name": "p", "kind": "ssh", "config": {"host": "a\u0000b"}}, "config.host"),
    ],
)
async def test_invalid_registrations_are_422_naming_the_field(
    api: httpx.AsyncClient, body: dict[str, Any], field: str
) -> None:
    response = await api.post(DEFAULT, json=body)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert error["field"] == field
    assert (await api.get(DEFAULT)).json()["providers"] == []


async def test_an_unknown_kind_lists_the_known_ones(api: httpx.AsyncClient) -> None:
    response = await api.post(DEFAULT, json={"name": "p", "kind": "nope"})
    message = response.json()["error"]["message"]
    assert '"nope"' in message
    assert all(kind in message for kind in ("fake", "ssh", "slurm"))


@pytest.mark.parametrize("body", [[], "x", None, 3])
async def test_a_body_that_is_not_an_object_is_422(api: httpx.AsyncClient, body: Any) -> None:
    assert (await api.post(DEFAULT, json=body)).status_code == 422


async def test_a_duplicate_name_is_a_conflict(api: httpx.AsyncClient) -> None:
    await add(api, name="dry", kind="fake")
    again = await api.post(DEFAULT, json={"name": "dry", "kind": "ssh"})
    assert again.status_code == 409
    assert again.json()["error"] == {
        "code": "conflict",
        "message": 'provider "dry" already exists in this namespace',
        "field": "name",
    }
    assert (await api.post("/v1/namespaces", json={"name": "team-b"})).status_code == 201
    await add(api, ns="team-b", name="dry", kind="fake")  # another namespace: no clash


async def test_a_namespace_token_sees_only_its_own_providers(api: httpx.AsyncClient) -> None:
    team_a = await namespace_token(api, "team-a")
    team_b = await namespace_token(api, "team-b")
    assert (
        await api.post(
            PROVIDERS.format(ns="team-a"), json={"name": "own", "kind": "fake"}, headers=team_a
        )
    ).status_code == 201
    await add(api, ns="team-b", name="secret", kind="fake")
    base = PROVIDERS.format(ns="team-b")
    for response in (
        await api.get(base, headers=team_a),
        await api.get(f"{base}/secret", headers=team_a),
        await api.get(f"{base}/secret/launches", headers=team_a),
        await api.delete(f"{base}/secret", headers=team_a),
        await api.post(base, json={"name": "mine", "kind": "fake"}, headers=team_a),
    ):
        assert response.status_code == 404, response.text
        assert response.json()["error"]["field"] == "namespace"
    listed = await api.get(PROVIDERS.format(ns="team-a"), headers=team_a)
    assert [p["name"] for p in listed.json()["providers"]] == ["own"]
    assert (await api.get(f"{base}/secret", headers=team_b)).status_code == 200


async def test_only_the_admin_registers_an_admin_only_kind(api: httpx.AsyncClient) -> None:
    team = await namespace_token(api, "team-a")
    url = PROVIDERS.format(ns="team-a")
    register("test-admin", Kind(config=FakeConfig, factory=FakeProvider, admin_only=True))
    try:
        refused = await api.post(url, json={"name": "box", "kind": "test-admin"}, headers=team)
        assert refused.status_code == 403
        error = refused.json()["error"]
        assert error["code"] == "forbidden"
        assert "only the admin token" in error["message"]
        assert '"test-admin"' in error["message"]
        assert (await api.get(url, headers=team)).json()["providers"] == []
        # the same token may still register kinds that are not admin-only
        ok = await api.post(url, json={"name": "dry", "kind": "fake"}, headers=team)
        assert ok.status_code == 201
        created = await api.post(url, json={"name": "box", "kind": "test-admin"})
        assert created.status_code == 201, created.text
        assert created.json()["kind"] == "test-admin"
    finally:
        KINDS.pop("test-admin", None)


async def test_a_provider_a_queue_names_cannot_be_deleted(api: httpx.AsyncClient) -> None:
    await add(api, name="dry", kind="fake")
    await add(api, name="other", kind="fake")
    for queue in (
        {"name": "by-ref", "providerRef": "dry"},
        {"name": "by-template", "daemonTemplate": {"provider": "dry"}},
        # mentions "dry" without launching through it
        {"name": "bystander", "daemonTemplate": {"provider": "other", "cloudTags": {"x": "dry"}}},
    ):
        assert (await api.post(QUEUES, json=queue)).status_code == 201
    refused = await api.delete(f"{DEFAULT}/dry")
    assert refused.status_code == 409
    message = refused.json()["error"]["message"]
    assert '"by-ref"' in message
    assert '"by-template"' in message
    assert "bystander" not in message
    assert (await api.get(f"{DEFAULT}/dry")).status_code == 200

    assert (await api.patch(f"{QUEUES}/by-ref", json={"providerRef": None})).status_code == 200
    still = await api.delete(f"{DEFAULT}/dry")
    assert still.status_code == 409
    assert "by-ref" not in still.json()["error"]["message"]
    assert (
        await api.patch(f"{QUEUES}/by-template", json={"daemonTemplate": None})
    ).status_code == 200
    assert (await api.delete(f"{DEFAULT}/dry")).status_code == 200
    assert (await api.delete(f"{DEFAULT}/other")).status_code == 409  # bystander uses it


async def test_archived_queues_do_not_hold_a_provider(api: httpx.AsyncClient) -> None:
    await add(api, name="dry", kind="fake")
    assert (await api.post(QUEUES, json={"name": "old", "providerRef": "dry"})).status_code == 201
    assert (await api.post(f"{QUEUES}/old/archive")).status_code == 200
    assert (await api.delete(f"{DEFAULT}/dry")).status_code == 200


async def test_launches_are_listed_newest_first_in_pages(
    api: httpx.AsyncClient, store: Store, clock: FakeClock
) -> None:
    await add(api, name="dry", kind="fake")
    await add(api, name="other", kind="fake")
    ns_id = await namespace_id(api)
    rows = []
    for i in range(5):
        created = clock.now + timedelta(seconds=i)
        rows.append(
            {
                "id": f"launch_{i}",
                "namespace_id": ns_id,
                "scope": "gpu" if i % 2 else "pool:shared",
                "provider_name": "dry",
                "created_at": created,
                "expires_at": created + timedelta(seconds=15),
                "body": {"queues": ["gpu"], "capacity": i + 1},
            }
        )
    rows.append({**rows[0], "id": "launch_elsewhere", "provider_name": "other"})
    async with store.write() as conn:
        await launch_store.record(conn, rows)
        await launch_store.resolve(
            conn, "launch_3", state="failed", now=clock.now, error="quota exceeded"
        )

    seen: list[dict[str, Any]] = []
    cursor = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 2}
        if cursor:
            params["cursor"] = cursor
        response = await api.get(f"{DEFAULT}/dry/launches", params=params)
        assert response.status_code == 200, response.text
        page = response.json()
        pages += 1
        seen += page["launches"]
        cursor = page["next_cursor"]
        if cursor is None:
            break
        assert len(page["launches"]) == 2
    assert pages == 3
    assert [launch["id"] for launch in seen] == [f"launch_{i}" for i in (4, 3, 2, 1, 0)]
    failed = seen[1]
    assert failed["state"] == "failed"
    assert failed["error"] == "quota exceeded"
    assert failed["resolved_at"] == clock.now.isoformat()
    newest = seen[0]
    assert set(newest) == {
        "id", "scope", "state", "provider", "handle", "error", "worker", "body",
        "created_at", "expires_at", "resolved_at", "terminated_at", "terminate_error",
    }  # fmt: skip
    assert newest["provider"] == "dry"
    assert newest["state"] == "in_flight"
    assert newest["scope"] == "pool:shared"
    assert newest["body"] == {"queues": ["gpu"], "capacity": 5}
    assert newest["created_at"] == (clock.now + timedelta(seconds=4)).isoformat()

    other = (await api.get(f"{DEFAULT}/other/launches")).json()
    assert [launch["id"] for launch in other["launches"]] == ["launch_elsewhere"]
    assert other["next_cursor"] is None


@pytest.mark.parametrize(
    "cursor",
    [
        "garbage",
        "2026-01-01T00:00:00|x",  # no time zone
        "2026-01-01T00:00:00+00:00|",  # no id
        "2026-01-01T00:00:00+00:00|a\u0000b",
        "0001-01-01T00:00:00+01:00|x",  # before the first UTC time there is
    ],
)
async def test_a_cursor_the_server_did_not_issue_is_422(
    api: httpx.AsyncClient, cursor: str
) -> None:
    await add(api, name="dry", kind="fake")
    response = await api.get(f"{DEFAULT}/dry/launches", params={"cursor": cursor})
    assert response.status_code == 422
    assert response.json()["error"]["field"] == "cursor"


async def test_launches_of_an_unknown_provider_are_404(api: httpx.AsyncClient) -> None:
    for name in ("nobody", "Not%20A%20Name"):
        response = await api.get(f"{DEFAULT}/{name}/launches")
        assert response.status_code == 404
        assert response.json()["error"]["field"] == "name"


async def test_by_names_loads_many_registrations_in_one_call(
    api: httpx.AsyncClient, store: Store
) -> None:
    await add(api, name="dry", kind="fake")
    assert (await api.post("/v1/namespaces", json={"name": "team-b"})).status_code == 201
    await add(api, ns="team-b", name="dry", kind="ssh")
    default_id, team_id = await namespace_id(api), await namespace_id(api, "team-b")
    async with store.read() as conn:
        found = await provider_store.by_names(
            conn, [(default_id, "dry"), (team_id, "dry"), (team_id, "missing")]
        )
        assert await provider_store.by_names(conn, []) == {}
        # past the IN-list limit: every registration is read and filtered, still one query
        many = [(team_id, f"absent-{i}") for i in range(provider_store.BY_NAMES_IN_LIMIT)]
        assert set(await provider_store.by_names(conn, [*many, (team_id, "dry")])) == {
            (team_id, "dry")
        }
    assert set(found) == {(default_id, "dry"), (team_id, "dry")}
    assert found[(default_id, "dry")]["kind"] == "fake"
    assert found[(team_id, "dry")]["kind"] == "ssh"
