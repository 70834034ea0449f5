"""A launched daemon's worker token opens the worker routes and nothing else (both stores).

The token travels in the daemon's environment, its pod's Secret or its machine's
user-data; whoever reads it there must not be able to launch daemons, write queues,
submit or cancel work, or read the namespace's invocations.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from lakeshore.providers import LaunchRequest
from lakeshore.providers.fake import FakeProvider
from tests.integration.test_api_auth import namespace_token
from tests.integration.test_controller import NS, elastic, provider, queue, submit_many

W = "/v1/workers"
REFUSAL = "a worker token (minted for one launched daemon) may call only the worker routes"


async def launched(
    api: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch, queue_name: str
) -> tuple[str, dict[str, str]]:
    """Launch one daemon for ``queue_name`` through the fake provider, as a user would
    (``POST …/daemons``); its launch id and the worker token the launch minted."""
    seen: list[LaunchRequest] = []
    original = FakeProvider.launch

    async def capture(self: FakeProvider, request: LaunchRequest) -> dict[str, Any]:
        seen.append(request)
        return await original(self, request)

    monkeypatch.setattr(FakeProvider, "launch", capture)
    made = await api.post(f"{NS}/daemons", json={"queue": queue_name})
    assert made.status_code == 201, made.text
    (request,) = seen
    assert request.token is not None
    return request.launch_id, {"Authorization": f"Bearer {request.token}"}


def _filled(path: str) -> str:
    """A route's path with every parameter given a plausible value."""
    values = {"ns": "default", "name": "work", "pool": "shared"}
    return re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), "x1"), path)


async def test_a_worker_token_does_a_daemons_work(
    api: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    await provider(api)
    await queue(api, "work", elastic(max=2), providerRef="fk")
    launch_id, worker = await launched(api, monkeypatch, "work")
    await submit_many(api, "work", 1)
    body = {"queues": ["work"], "launch_id": launch_id, "capabilities": {"max_invocations": 1}}
    joined = await api.post(f"{W}/hello", json=body, headers=worker)
    assert joined.status_code == 200, joined.text
    worker_id = joined.json()["id"]
    claimed = await api.post(f"{W}/{worker_id}/claim", json={"timeout_s": 0}, headers=worker)
    assert claimed.status_code == 200, claimed.text
    (invocation,) = claimed.json()["invocations"]
    beat = await api.post(
        f"{W}/{worker_id}/heartbeat", json={"running": [invocation["id"]]}, headers=worker
    )
    assert beat.status_code == 200, beat.text
    done = await api.post(
        f"{W}/{worker_id}/invocations/{invocation['id']}/complete",
        json={"result": 1},
        headers=worker,
    )
    assert done.status_code == 200, done.text
    assert (await api.get("/healthz", headers=worker)).status_code == 200
    bye = await api.post(f"{W}/{worker_id}/bye", headers=worker)
    assert bye.status_code == 200, bye.text


async def test_a_worker_token_is_refused_on_every_other_route(
    api: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every route the server has (from its OpenAPI document), every method: 403 with the
    same message, and nothing changed."""
    await provider(api)
    await queue(api, "work", elastic(max=2), providerRef="fk")
    _, worker = await launched(api, monkeypatch, "work")
    await submit_many(api, "work", 1)
    before = (await api.get(f"{NS}/queues/work/invocations")).json()
    paths = (await api.get("/openapi.json")).json()["paths"]
    tried = 0
    for path, operations in paths.items():
        if path.startswith(f"{W}/") or path == "/healthz":
            continue
        for method in operations:
            response = await api.request(method.upper(), _filled(path), json={}, headers=worker)
            assert response.status_code == 403, (method, path, response.text)
            assert response.json()["error"]["code"] == "forbidden"
            assert REFUSAL in response.json()["error"]["message"], (method, path)
            tried += 1
    assert tried >= 20  # queues, invocations, daemons, providers, feed, namespaces, admin
    assert (await api.get(f"{NS}/queues/work/invocations")).json() == before
    assert (await api.get(f"{NS}/queues/work")).json()["state"] == "active"
    assert len((await api.get(f"{NS}/daemons")).json()["daemons"]) == 0


async def test_what_a_worker_token_is_refused_a_namespace_token_may_do(
    api: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refusal is about the token's kind: a namespace token of the same namespace
    submits and launches."""
    await provider(api)
    await queue(api, "work", elastic(max=2), providerRef="fk")
    _, worker = await launched(api, monkeypatch, "work")
    user = await namespace_token(api, "default")
    submit = {"fn": "tests.udfs:noop"}
    refused = await api.post(f"{NS}/queues/work/invocations", json=submit, headers=worker)
    assert refused.status_code == 403
    accepted = await api.post(f"{NS}/queues/work/invocations", json=submit, headers=user)
    assert accepted.status_code == 201, accepted.text
    launch = {"queue": "work"}
    assert (await api.post(f"{NS}/daemons", json=launch, headers=worker)).status_code == 403
    assert (await api.post(f"{NS}/daemons", json=launch, headers=user)).status_code == 201
