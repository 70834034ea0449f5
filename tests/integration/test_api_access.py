"""A queue's authPolicy through the API (both stores): which namespace tokens may submit
to, read from, or claim from it; the admin token is never refused; a refusal is a 403
that names the rule, and leaves nothing behind."""

from __future__ import annotations

from typing import Any

import httpx

NS = "/v1/namespaces/default"
W = "/v1/workers"


async def _token(api: httpx.AsyncClient, name: str) -> dict[str, str]:
    issued = await api.post(f"{NS}/tokens", json={"name": name})
    assert issued.status_code == 201, issued.text
    return {"Authorization": f"Bearer {issued.json()['token']}"}


async def _queue(api: httpx.AsyncClient, name: str, policy: Any) -> None:
    made = await api.post(f"{NS}/queues", json={"name": name, "authPolicy": policy})
    assert made.status_code == 201, made.text


def _refused(response: httpx.Response, rule: str) -> None:
    assert response.status_code == 403, response.text
    assert rule in response.json()["error"]["message"]


async def test_submit_and_read_follow_the_queues_policy(api: httpx.AsyncClient) -> None:
    ci, viewer, other = [await _token(api, n) for n in ("ci", "viewer", "other")]
    await _queue(api, "gated", {"submit": ["ci"], "read": ["ci", "viewer"]})
    body = {"fn": "tests.udfs:noop"}
    made = await api.post(f"{NS}/queues/gated/invocations", json=body, headers=ci)
    assert made.status_code == 201, made.text
    invocation = made.json()["id"]
    refused = await api.post(f"{NS}/queues/gated/invocations", json=body, headers=viewer)
    _refused(refused, 'queue "gated": authPolicy.submit does not list token "viewer"')
    batch = {"invocations": [body, body]}
    _refused(
        await api.post(f"{NS}/queues/gated/invocations/batch", json=batch, headers=other),
        "authPolicy.submit",
    )
    listed = await api.get(f"{NS}/queues/gated/invocations", headers=viewer)
    assert [i["id"] for i in listed.json()["invocations"]] == [invocation]  # nothing more
    assert (await api.get(f"{NS}/invocations/{invocation}", headers=viewer)).status_code == 200
    _refused(await api.get(f"{NS}/invocations/{invocation}", headers=other), "authPolicy.read")
    _refused(await api.get(f"{NS}/queues/gated/invocations", headers=other), "authPolicy.read")
    stream = await api.get(f"{NS}/invocations/{invocation}/stream", headers=other)
    _refused(stream, "authPolicy.read")
    cancel = await api.post(f"{NS}/invocations/{invocation}/cancel", headers=viewer)
    _refused(cancel, "authPolicy.submit")
    admin = await api.post(f"{NS}/queues/gated/invocations", json=body)  # the admin token
    assert admin.status_code == 201
    open_queue = await api.post(f"{NS}/queues/open/invocations", json=body, headers=other)
    assert open_queue.status_code == 201  # no policy: every token of the namespace


async def test_a_token_is_named_by_its_id_too_and_an_empty_list_is_admin_only(
    api: httpx.AsyncClient,
) -> None:
    issued = await api.post(f"{NS}/tokens", json={})  # no name
    token_id = issued.json()["id"]
    unnamed = {"Authorization": f"Bearer {issued.json()['token']}"}
    await _queue(api, "by-id", {"submit": [token_id], "read": []})
    body = {"fn": "tests.udfs:noop"}
    made = await api.post(f"{NS}/queues/by-id/invocations", json=body, headers=unnamed)
    assert made.status_code == 201, made.text
    read = await api.get(f"{NS}/invocations/{made.json()['id']}", headers=unnamed)
    _refused(read, f"authPolicy.read does not list token {token_id}")
    assert (await api.get(f"{NS}/invocations/{made.json()['id']}")).status_code == 200


async def test_claim_is_gated_at_hello_and_at_every_claim(api: httpx.AsyncClient) -> None:
    runner, intruder = await _token(api, "runner"), await _token(api, "intruder")
    await _queue(api, "jobs", {"claim": ["runner"]})
    body = {"queues": ["jobs"], "capabilities": {"max_invocations": 4}}
    _refused(
        await api.post(f"{W}/hello", json=body, headers=intruder),
        'queue "jobs": authPolicy.claim does not list token "intruder"',
    )
    made = await api.post(f"{NS}/queues/jobs/invocations", json={"fn": "tests.udfs:noop"})
    assert made.status_code == 201
    hello = await api.post(f"{W}/hello", json=body, headers=runner)
    assert hello.status_code == 200, hello.text
    worker = hello.json()["id"]
    # a policy written after the hello is read at the next claim
    patched = await api.patch(f"{NS}/queues/jobs", json={"authPolicy": {"claim": ["someone"]}})
    assert patched.status_code == 200, patched.text
    empty = await api.post(f"{W}/{worker}/claim", json={"timeout_s": 0}, headers=runner)
    assert empty.json()["invocations"] == []
    await api.patch(f"{NS}/queues/jobs", json={"authPolicy": {"claim": ["runner"]}})
    claimed = await api.post(f"{W}/{worker}/claim", json={"timeout_s": 0}, headers=runner)
    assert [i["id"] for i in claimed.json()["invocations"]] == [made.json()["id"]]


async def test_a_bad_policy_is_refused_with_the_field(api: httpx.AsyncClient) -> None:
    bad = await api.post(f"{NS}/queues", json={"name": "bad", "authPolicy": {"write": []}})
    assert bad.status_code == 422
    assert bad.json()["error"]["field"] == "authPolicy.write"
    assert (await api.get(f"{NS}/queues/bad")).status_code == 404  # nothing left behind
