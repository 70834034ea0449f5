"""Retrying invocations through the API, one by id and in bulk by state (both stores)."""

from __future__ import annotations

import httpx
import pytest

from lakeshore.services.taskqueue import invocations as inv_service
from tests.integration.test_api_workers import NS, W, claim, hello, submit

ERROR = {"type": "ValueError", "message": "bad"}


async def fail(api: httpx.AsyncClient, worker: str, ids: list[str]) -> None:
    body = {"results": [{"id": i, "error": ERROR, "retry": False} for i in ids]}
    assert (await api.post(f"{W}/{worker}/results", json=body)).status_code == 200


async def test_a_failed_invocation_is_retried_with_its_id_and_key(api: httpx.AsyncClient) -> None:
    made = await submit(api, "rq", key="once")
    worker = await hello(api, ["rq"])
    [held] = await claim(api, worker)
    await fail(api, worker, [held["id"]])

    retried = await api.post(f"{NS}/invocations/{made['id']}/retry")

    assert retried.status_code == 200, retried.text
    again = retried.json()
    assert (again["id"], again["key"], again["state"]) == (made["id"], "once", "pending")
    assert (again["error"], again["worker"], again["max_attempts"]) == (None, None, 2)
    [second] = await claim(api, worker)
    assert second["id"] == made["id"]
    body = {"results": [{"id": made["id"], "result": 7}]}
    assert (await api.post(f"{W}/{worker}/results", json=body)).status_code == 200
    done = (await api.get(f"{NS}/invocations/{made['id']}")).json()
    assert (done["state"], done["result"], done["attempts"]) == ("succeeded", 7, 2)
    resubmitted = await api.post(f"{NS}/queues/rq/invocations", json={"fn": "m:f", "key": "once"})
    assert (resubmitted.status_code, resubmitted.json()["id"]) == (200, made["id"])


async def test_only_a_finished_unsucceeded_invocation_is_retried(api: httpx.AsyncClient) -> None:
    first = await submit(api, "rq2")
    worker = await hello(api, ["rq2"])
    [won] = await claim(api, worker, max=1)
    body = {"results": [{"id": won["id"], "result": 1}]}
    assert (await api.post(f"{W}/{worker}/results", json=body)).status_code == 200
    running = await submit(api, "rq2")
    [held] = await claim(api, worker, max=1)
    pending = await submit(api, "rq2")
    assert (won["id"], held["id"]) == (first["id"], running["id"])

    answers = {
        state: await api.post(f"{NS}/invocations/{i}/retry")
        for state, i in (
            ("succeeded", won["id"]),
            ("running", held["id"]),
            ("pending", pending["id"]),
        )
    }
    missing = await api.post(f"{NS}/invocations/inv_nope/retry")

    for state, answer in answers.items():
        assert answer.status_code == 409, answer.text
        assert f"invocation is {state}" in answer.text
    assert missing.status_code == 404


async def test_bulk_retry_touches_every_failed_one_in_batches(
    api: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(inv_service, "RETRY_BATCH", 3)
    made = [await submit(api, "bulk") for _ in range(10)]
    worker = await hello(api, ["bulk"], capacity=10)
    held = await claim(api, worker, max=10)
    await fail(api, worker, [h["id"] for h in held])

    answer = await api.post(f"{NS}/queues/bulk/invocations/retry", json={"state": "failed"})

    assert answer.status_code == 200, answer.text
    assert answer.json() == {"touched": 10}
    states = {(await api.get(f"{NS}/invocations/{m['id']}")).json()["state"] for m in made}
    assert states == {"pending"}
    cancelled = await api.post(f"{NS}/queues/bulk/invocations/cancel", json={"state": "pending"})
    assert cancelled.json() == {"touched": 10}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("retry", {"state": "pending"}),
        ("retry", {"state": "bogus"}),
        ("retry", {}),
        ("retry", []),
        ("cancel", {"state": "failed"}),
        ("cancel", {"state": "pending", "extra": 1}),
    ],
)
async def test_bad_bulk_bodies_are_refused_whole(
    api: httpx.AsyncClient, path: str, body: object
) -> None:
    await submit(api, "bulk-bad")
    answer = await api.post(f"{NS}/queues/bulk-bad/invocations/{path}", json=body)
    assert answer.status_code == 422, answer.text
    stats = (await api.get(f"{NS}/queues/bulk-bad/stats")).json()
    assert stats["byState"]["pending"] == 1
