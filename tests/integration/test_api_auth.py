"""Tokens and namespaces: who may see and do what."""

from __future__ import annotations

import stat
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from lakeshore.services.auth import load_or_create_admin_token
from lakeshore.store.engine import Store
from lakeshore.store.tables import tokens

QUEUES = "/v1/namespaces/{ns}/queues"


async def namespace_token(api: httpx.AsyncClient, ns: str) -> dict[str, str]:
    if ns != "default":
        assert (await api.post("/v1/namespaces", json={"name": ns})).status_code == 201
    issued = await api.post(f"/v1/namespaces/{ns}/tokens", json={"name": "ci"})
    assert issued.status_code == 201, issued.text
    return {"Authorization": f"Bearer {issued.json()['token']}"}


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": "Bearer lks_0123456789abcdef_notthesecret"},
        {"Authorization": "Basic dXNlcjpwYXNz"},
        {"Authorization": "Bearer"},
    ],
    ids=["none", "wrong", "unknown-id", "basic", "empty-bearer"],
)
async def test_no_or_a_wrong_token_is_401(api: httpx.AsyncClient, headers: dict[str, str]) -> None:
    api.headers.pop("Authorization")
    for response in (
        await api.get(QUEUES.format(ns="default"), headers=headers),
        await api.post(QUEUES.format(ns="default"), json={"name": "q"}, headers=headers),
        await api.get("/v1/namespaces", headers=headers),
        await api.post("/v1/namespaces", json={"name": "x"}, headers=headers),
    ):
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "unauthorized"
        assert response.headers["www-authenticate"] == "Bearer"


async def test_health_needs_no_token(api: httpx.AsyncClient) -> None:
    assert (await api.get("/healthz", headers={"Authorization": ""})).status_code == 200


async def test_a_token_with_the_right_id_and_a_wrong_secret_is_401(api: httpx.AsyncClient) -> None:
    good = (await namespace_token(api, "team-a"))["Authorization"]
    tampered = good[:-4] + ("AAAA" if not good.endswith("AAAA") else "BBBB")
    response = await api.get(QUEUES.format(ns="team-a"), headers={"Authorization": tampered})
    assert response.status_code == 401


async def test_a_namespace_token_works_in_its_namespace(api: httpx.AsyncClient) -> None:
    team = await namespace_token(api, "team-a")
    created = await api.post(QUEUES.format(ns="team-a"), json={"name": "gpu"}, headers=team)
    assert created.status_code == 201
    listed = await api.get(QUEUES.format(ns="team-a"), headers=team)
    assert [q["name"] for q in listed.json()["queues"]] == ["gpu"]
    visible = await api.get("/v1/namespaces", headers=team)
    assert [n["name"] for n in visible.json()["namespaces"]] == ["team-a"]


async def test_another_namespaces_queue_is_404_not_403(api: httpx.AsyncClient) -> None:
    team_a = await namespace_token(api, "team-a")
    team_b = await namespace_token(api, "team-b")
    assert (
        await api.post(QUEUES.format(ns="team-b"), json={"name": "secret"}, headers=team_b)
    ).status_code == 201
    base = QUEUES.format(ns="team-b")
    for response in (
        await api.get(f"{base}/secret", headers=team_a),
        await api.get(base, headers=team_a),
        await api.patch(f"{base}/secret", json={"kind": "filo"}, headers=team_a),
        await api.post(f"{base}/secret/drain", headers=team_a),
        await api.get(f"{base}/secret/stats", headers=team_a),
        await api.post(base, json={"name": "planted"}, headers=team_a),
    ):
        assert response.status_code == 404
    # and nothing changed there
    secret = (await api.get(f"{base}/secret", headers=team_b)).json()
    assert (secret["kind"], secret["state"]) == ("fifo", "active")
    assert (await api.get(f"{base}/planted", headers=team_b)).status_code == 404


async def test_a_missing_namespace_looks_like_a_foreign_one(api: httpx.AsyncClient) -> None:
    team_a = await namespace_token(api, "team-a")
    foreign = await api.get(QUEUES.format(ns="nowhere"), headers=team_a)
    missing_for_admin = await api.get(QUEUES.format(ns="nowhere"))
    assert foreign.status_code == missing_for_admin.status_code == 404


async def test_only_the_admin_creates_namespaces_and_tokens(api: httpx.AsyncClient) -> None:
    team = await namespace_token(api, "team-a")
    refused_ns = await api.post("/v1/namespaces", json={"name": "mine"}, headers=team)
    refused_token = await api.post("/v1/namespaces/team-a/tokens", json={}, headers=team)
    assert refused_ns.status_code == refused_token.status_code == 403
    assert "admin" in refused_ns.json()["error"]["message"]
    names = [n["name"] for n in (await api.get("/v1/namespaces")).json()["namespaces"]]
    assert "mine" not in names


async def test_namespace_names_are_validated_and_unique(api: httpx.AsyncClient) -> None:
    bad = await api.post("/v1/namespaces", json={"name": "Team A"})
    assert bad.status_code == 422
    assert bad.json()["error"]["field"] == "name"
    assert (await api.post("/v1/namespaces", json={"name": "team-a"})).status_code == 201
    again = await api.post("/v1/namespaces", json={"name": "team-a"})
    assert again.status_code == 409


async def test_the_default_namespace_exists_from_the_start(api: httpx.AsyncClient) -> None:
    names = [n["name"] for n in (await api.get("/v1/namespaces")).json()["namespaces"]]
    assert names == ["default"]


async def test_tokens_are_stored_only_as_hashes(api: httpx.AsyncClient, store: Store) -> None:
    issued = (await api.post("/v1/namespaces/default/tokens", json={"name": "ci"})).json()
    secret = issued["token"].split("_", 2)[2]
    async with store.read() as conn:
        rows = (await conn.execute(select(tokens))).mappings().all()
    assert len(rows) == 1
    assert rows[0]["id"] == issued["id"]
    assert secret not in str(dict(rows[0]))
    assert issued["token"] not in str(dict(rows[0]))


def test_admin_token_is_generated_once_with_mode_0600(tmp_path: Path) -> None:
    path = tmp_path / "data" / "admin-token"
    token, where = load_or_create_admin_token(None, path)
    assert where == path
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again, _ = load_or_create_admin_token(None, path)
    assert again == token
    configured, where = load_or_create_admin_token("from-env", path)
    assert (configured, where) == ("from-env", None)
