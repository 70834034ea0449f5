"""Batched reports: many outcomes in one request and one transaction, then more claimed."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.integration.test_api_workers import NS, W, claim, hello, submit


async def state_of(api: httpx.AsyncClient, invocation_id: str) -> dict[str, Any]:
    return dict((await api.get(f"{NS}/invocations/{invocation_id}")).json())


async def test_outcomes_are_recorded_each_by_its_kind(api: httpx.AsyncClient) -> None:
    for n in range(4):
        await submit(api, "batch", key=f"k{n}", max_attempts=2)
    worker = await hello(api, ["batch"])
    a, b, c, d = await claim(api, worker, max=4)
    error = {"type": "ValueError", "message": "bad"}
    body = {
        "results": [
            {"id": a["id"], "result": {"n": 1}},
            {"id": b["id"], "error": error},  # retried by default
            {"id": c["id"], "error": error, "retry": False},
            {"id": "inv_nobody", "result": 2},
        ]
    }
    response = await api.post(f"{W}/{worker}/results", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert [(r["id"], r.get("state"), r.get("refused")) for r in answer["results"]] == [
        (a["id"], "succeeded", None),
        (b["id"], "pending", None),
        (c["id"], "failed", None),
        ("inv_nobody", None, "not_held"),
    ]
    assert (answer["invocations"], answer["retired"]) == ([], False)
    got = [await state_of(api, i["id"]) for i in (a, b, c, d)]
    assert [(i["state"], i["result"]) for i in got] == [
        ("succeeded", {"n": 1}),
        ("pending", None),
        ("failed", None),
        ("running", None),
    ]
    assert got[1]["error"] == got[2]["error"] == error
    assert got[0]["finished_at"] is not None and got[1]["worker"] is None
    again = await api.post(f"{W}/{worker}/results", json={"results": [{"id": a["id"]}]})
    assert again.json()["results"][0]["refused"] == "not_held"  # once only
    assert (await state_of(api, a["id"]))["result"] == {"n": 1}


async def test_a_report_claims_more_without_waiting_up_to_the_capacity(
    api: httpx.AsyncClient,
) -> None:
    for n in range(5):
        await submit(api, "refill", key=f"k{n}")
    worker = await hello(api, ["refill"], capacity=3)
    held = await claim(api, worker, max=3)
    body = {"results": [{"id": held[0]["id"], "result": 0}], "claim": 10}
    answer = (await api.post(f"{W}/{worker}/results", json=body)).json()
    assert len(answer["invocations"]) == 1  # one slot freed; capacity 3 caps the claim
    [more] = answer["invocations"]
    assert (more["state"], more["worker"]) == ("running", worker)
    body = {"results": [{"id": i["id"], "result": 0} for i in (*held[1:], more)], "claim": 10}
    answer = (await api.post(f"{W}/{worker}/results", json=body)).json()
    assert [r["state"] for r in answer["results"]] == ["succeeded"] * 3
    assert len(answer["invocations"]) == 1  # the last pending one
    stats = (await api.get(f"{NS}/queues/refill/stats")).json()
    assert (stats["byState"]["succeeded"], stats["byState"]["running"]) == (4, 1)


async def test_a_result_over_the_cap_or_not_storable_is_refused_alone(
    api: httpx.AsyncClient,
) -> None:
    for n in range(3):
        await submit(api, "caps", key=f"k{n}")
    worker = await hello(api, ["caps"])
    big, odd, fine = await claim(api, worker, max=3)
    body = {
        "results": [
            {"id": big["id"], "result": "x" * 600_000},
            {"id": odd["id"], "result": {"text": "nul \u0000 inside"}},
            {"id": fine["id"], "result": "ok"},
        ]
    }
    answer = (await api.post(f"{W}/{worker}/results", json=body)).json()
    outcomes = {r["id"]: r.get("refused", r.get("state")) for r in answer["results"]}
    assert outcomes == {big["id"]: "too_large", odd["id"]: "invalid", fine["id"]: "succeeded"}
    assert "LAKESHORE_MAX_RESULT_BYTES" in answer["results"][1]["message"]
    assert [(await state_of(api, i["id"]))["state"] for i in (big, odd)] == ["running"] * 2


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"results": "x"},
        {"results": [{"id": "inv_1"}, {"id": "inv_1"}]},
        {"results": [{"id": "inv_1", "result": 1, "error": {"type": "E"}}]},
        {"results": [{"id": "inv_1", "reslt": 1}]},
        {"results": [{"id": ""}]},
        {"results": [{"id": f"inv_{n}"} for n in range(1001)]},
        {"results": [], "claim": -1},
        {"results": [], "claim": 1.5},
        {"results": [{"id": "inv_1", "error": {"type": 3}}]},
    ],
)
async def test_a_malformed_report_is_refused_whole_and_changes_nothing(
    api: httpx.AsyncClient, body: Any
) -> None:
    await submit(api, "bad-report")
    worker = await hello(api, ["bad-report"])
    [held] = await claim(api, worker)
    if body.get("results") and isinstance(body["results"], list) and len(body["results"]) < 3:
        for item in body["results"]:
            item["id"] = held["id"] if item["id"] == "inv_1" else item["id"]
    response = await api.post(f"{W}/{worker}/results", json=body)
    assert response.status_code == 422, response.text
    assert (await state_of(api, held["id"]))["state"] == "running"


async def test_an_unknown_worker_is_not_found(api: httpx.AsyncClient) -> None:
    response = await api.post(f"{W}/wrk_nobody/results", json={"results": []})
    assert response.status_code == 404
