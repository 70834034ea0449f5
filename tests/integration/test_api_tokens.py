"""Listing and revoking namespace tokens through the API (both stores)."""

from __future__ import annotations

import httpx

from tests.conftest import FakeClock

NS = "/v1/namespaces/default"


async def issue(api: httpx.AsyncClient, name: str, ns: str = "default") -> dict[str, str]:
    issued = await api.post(f"/v1/namespaces/{ns}/tokens", json={"name": name})
    assert issued.status_code == 201, issued.text
    return dict(issued.json())


def bearer(token: dict[str, str]) -> dict[str, str]:
    return {"Authorization": f"Bearer {token['token']}"}


async def test_tokens_are_listed_without_secrets(api: httpx.AsyncClient, clock: FakeClock) -> None:
    first = await issue(api, "ci")
    clock.advance(1)  # oldest first
    second = await issue(api, "laptop")
    listed = await api.get(f"{NS}/tokens")
    assert listed.status_code == 200
    tokens = listed.json()["tokens"]
    assert [(t["id"], t["name"], t["revokedAt"]) for t in tokens] == [
        (first["id"], "ci", None),
        (second["id"], "laptop", None),
    ]
    assert first["token"] not in listed.text and second["token"] not in listed.text
    assert "secret" not in listed.text


async def test_a_revoked_token_is_refused_at_once_and_stays_listed(
    api: httpx.AsyncClient,
) -> None:
    token = await issue(api, "leaked")
    assert (await api.get(f"{NS}/queues", headers=bearer(token))).status_code == 200
    revoked = await api.delete(f"{NS}/tokens/{token['id']}")
    assert revoked.status_code == 200, revoked.text
    assert revoked.json()["revokedAt"] is not None
    assert "token" not in revoked.json()
    refused = await api.get(f"{NS}/queues", headers=bearer(token))
    assert refused.status_code == 401  # not a second later: this server forgot it
    again = await api.delete(f"{NS}/tokens/{token['id']}")
    assert again.json()["revokedAt"] == revoked.json()["revokedAt"]
    [listed] = (await api.get(f"{NS}/tokens")).json()["tokens"]
    assert listed["revokedAt"] == revoked.json()["revokedAt"]


async def test_only_the_admin_lists_or_revokes_and_only_in_the_token_s_namespace(
    api: httpx.AsyncClient,
) -> None:
    assert (await api.post("/v1/namespaces", json={"name": "other"})).status_code == 201
    mine, theirs = await issue(api, "mine"), await issue(api, "theirs", ns="other")
    as_namespace = bearer(mine)
    assert (await api.get(f"{NS}/tokens", headers=as_namespace)).status_code == 403
    denied = await api.delete(f"{NS}/tokens/{mine['id']}", headers=as_namespace)
    assert denied.status_code == 403
    # another namespace's token is not this namespace's to revoke
    wrong = await api.delete(f"{NS}/tokens/{theirs['id']}")
    assert wrong.status_code == 404
    assert (await api.get("/v1/namespaces/other/queues", headers=bearer(theirs))).status_code == 200
    assert (await api.delete(f"{NS}/tokens/tok_nope")).status_code == 404
    assert (await api.delete(f"{NS}/tokens/{'x' * 300}")).status_code == 404
