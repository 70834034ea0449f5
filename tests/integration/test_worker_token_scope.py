"""A launched daemon's worker token opens the worker routes and nothing else (both stores).

The token travels in the daemon's environment, its pod's Secret or its machine's
user-data; whoever reads it there must not be able to launch daemons, write queues,
submit or cancel work, or read the namespace's invocations.
"""

from __future__ import annotations

import hashlib
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
    # the launched machine fetches the server's wheel with its worker token
    dist = await api.get("/v1/dist", headers=worker)
    assert dist.status_code == 200, dist.text
    wheel = await api.get(dist.json()["url"], headers=worker)
    assert wheel.status_code == 200 and len(wheel.content) == dist.json()["size"]
    assert hashlib.sha256(wheel.content).hexdigest() == dist.json()["sha256"]
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
        if path.startswith((f"{W}/", "/v1/dist")) or path in ("/healthz", "/readyz"):
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


async def test_a_worker_token_acts_only_for_the_worker_its_launch_registered(
    api: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A launched daemon's token cannot heartbeat, complete for, or say goodbye for another
    worker of its namespace (404, as for a worker it cannot see), nor register more
    workers (403); its own worker saying hello again keeps working."""
    await provider(api)
    await queue(api, "work", elastic(max=2), providerRef="fk")
    launch_id, worker = await launched(api, monkeypatch, "work")
    user = await namespace_token(api, "default")
    other = await api.post(f"{W}/hello", json={"queues": ["work"]}, headers=user)
    assert other.status_code == 200, other.text
    victim = other.json()["id"]
    await submit_many(api, "work", 1)
    taken = await api.post(f"{W}/{victim}/claim", json={"timeout_s": 0}, headers=user)
    (held,) = taken.json()["invocations"]

    body = {"queues": ["work"], "launch_id": launch_id}
    mine = await api.post(f"{W}/hello", json=body, headers=worker)
    assert mine.status_code == 200, mine.text
    own = mine.json()["id"]

    forged = {"result": "forged"}
    attempts = [
        ("heartbeat", {"running": [held["id"]]}),
        (f"invocations/{held['id']}/complete", forged),
        ("results", {"results": [{"id": held["id"], "result": "forged"}]}),
        ("claim", {"timeout_s": 0}),
        ("bye", None),
    ]
    for route, payload in attempts:
        refused = await api.post(f"{W}/{victim}/{route}", json=payload, headers=worker)
        assert refused.status_code == 404, (route, refused.text)
    shown = (await api.get(f"{NS}/invocations/{held['id']}")).json()
    assert (shown["state"], shown["worker"]) == ("running", victim)

    for extra in ({"id": "another-one"}, {"id": victim}):
        more = await api.post(f"{W}/hello", json={**body, **extra}, headers=worker)
        assert more.status_code == 403, (extra, more.text)
    unnamed = await api.post(f"{W}/hello", json=body, headers=worker)  # no id: its own
    assert (unnamed.status_code, unnamed.json()["id"]) == (200, own)
    wrong_launch = await api.post(
        f"{W}/hello", json={**body, "id": own, "launch_id": "lch_someone_else"}, headers=worker
    )
    assert wrong_launch.status_code == 403, wrong_launch.text
    again = await api.post(f"{W}/hello", json={**body, "id": own}, headers=worker)
    assert (again.status_code, again.json()["id"]) == (200, own)
    daemons = (await api.get(f"{NS}/daemons")).json()["daemons"]
    assert sorted(d["id"] for d in daemons) == sorted([own, victim])


async def test_a_worker_token_says_hello_only_to_queues_that_exist(
    api: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    await provider(api)
    await queue(api, "work", elastic(max=2), providerRef="fk")
    launch_id, worker = await launched(api, monkeypatch, "work")
    body = {"queues": ["work", "made-up"], "launch_id": launch_id}
    refused = await api.post(f"{W}/hello", json=body, headers=worker)
    assert refused.status_code == 404, refused.text
    assert "made-up" in refused.json()["error"]["message"]
    names = [q["name"] for q in (await api.get(f"{NS}/queues")).json()["queues"]]
    assert "made-up" not in names
