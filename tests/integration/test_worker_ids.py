"""Worker ids are their namespace's own (both stores): a namespace may pick an id another
namespace uses, is neither refused nor told, and each worker acts on its own namespace's
work only; a retired id is refused in its namespace alone."""

from __future__ import annotations

import httpx

from tests.integration.test_api_auth import namespace_token

W = "/v1/workers"


async def _submit(api: httpx.AsyncClient, ns: str, headers: dict[str, str]) -> str:
    made = await api.post(
        f"/v1/namespaces/{ns}/queues/work/invocations", json={"fn": "m:f"}, headers=headers
    )
    assert made.status_code == 201, made.text
    return str(made.json()["id"])


async def test_two_namespaces_may_use_the_same_worker_id(api: httpx.AsyncClient) -> None:
    a, b = await namespace_token(api, "team-a"), await namespace_token(api, "team-b")
    a_work, b_work = await _submit(api, "team-a", a), await _submit(api, "team-b", b)
    for headers in (a, b):
        hello = await api.post(
            f"{W}/hello", json={"id": "gpu-box-1", "queues": ["work"]}, headers=headers
        )
        assert (hello.status_code, hello.json()["id"]) == (200, "gpu-box-1"), hello.text

    a_claim = await api.post(f"{W}/gpu-box-1/claim", json={"timeout_s": 0}, headers=a)
    b_claim = await api.post(f"{W}/gpu-box-1/claim", json={"timeout_s": 0}, headers=b)
    assert [i["id"] for i in a_claim.json()["invocations"]] == [a_work]
    assert [i["id"] for i in b_claim.json()["invocations"]] == [b_work]

    done = await api.post(
        f"{W}/gpu-box-1/invocations/{b_work}/complete", json={"result": 2}, headers=b
    )
    assert done.status_code == 200, done.text
    beat = await api.post(f"{W}/gpu-box-1/heartbeat", json={"running": [a_work]}, headers=a)
    assert beat.json()["held"] == [a_work]  # b's completion took nothing of a's
    assert (await api.post(f"{W}/gpu-box-1/bye", headers=b)).status_code == 200
    a_daemons = (await api.get("/v1/namespaces/team-a/daemons", headers=a)).json()["daemons"]
    assert [d["id"] for d in a_daemons] == ["gpu-box-1"]
    b_daemons = (await api.get("/v1/namespaces/team-b/daemons", headers=b)).json()["daemons"]
    assert b_daemons == []
    shown = (await api.get(f"/v1/namespaces/team-a/invocations/{a_work}", headers=a)).json()
    assert shown["state"] == "running"


async def test_a_retired_id_is_refused_in_its_own_namespace_only(api: httpx.AsyncClient) -> None:
    a, b = await namespace_token(api, "team-a"), await namespace_token(api, "team-b")
    hello = {"id": "box", "queues": ["work"]}
    assert (await api.post(f"{W}/hello", json=hello, headers=a)).status_code == 200
    killed = await api.delete("/v1/namespaces/team-a/daemons/box", headers=a)
    assert killed.status_code == 200, killed.text
    again = await api.post(f"{W}/hello", json=hello, headers=a)
    assert again.status_code == 410, again.text
    other = await api.post(f"{W}/hello", json=hello, headers=b)
    assert (other.status_code, other.json()["id"]) == (200, "box"), other.text
    claim = await api.post(f"{W}/box/claim", json={"timeout_s": 0}, headers=b)
    assert claim.status_code == 200, claim.text
