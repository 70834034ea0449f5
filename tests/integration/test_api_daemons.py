"""The manual fleet over HTTP (both stores): launch through a provider, list, kill."""

from __future__ import annotations

import httpx

from tests.integration.test_api_auth import namespace_token
from tests.integration.test_api_workers import claim, hello
from tests.integration.test_controller import NS, elastic, provider, queue, submit_many, tick

D = f"{NS}/daemons"


async def test_a_manual_launch_is_tracked_like_the_controllers(api: httpx.AsyncClient) -> None:
    await provider(api)
    await queue(api, "man", elastic(max=3), providerRef="fk")
    made = await api.post(D, json={"queue": "man", "count": 2})
    assert made.status_code == 201, made.text
    launches = made.json()["launches"]
    assert [launch["state"] for launch in launches] == ["in_flight", "in_flight"]
    await submit_many(api, "man", 3)
    decision = (await tick(api))["man"]  # the two booting daemons count as in flight
    assert decision["reason"] == "target 3 > daemons 0 + in flight 2 → launch"
    recorded = (await api.get(f"{NS}/providers/fk/launches")).json()["launches"]
    assert {launch["id"] for launch in recorded} >= {launch["launchId"] for launch in launches}


async def test_launch_refusals_are_clear(api: httpx.AsyncClient) -> None:
    await queue(api, "bare", elastic())
    no_provider = await api.post(D, json={"queue": "bare"})
    assert no_provider.status_code == 422
    assert "providerRef" in no_provider.json()["error"]["message"]
    assert (await api.post(D, json={"queue": "missing", "provider": "x"})).status_code == 404
    assert (await api.post(D, json={"queue": "bare", "provider": "nope"})).status_code == 404
    assert (await api.post(D, json={"queue": "bare", "count": 0})).status_code == 422
    assert (await api.post(D, json={"queue": "bare", "count": "2"})).status_code == 422
    await provider(api, "broken", fail_launch="out of capacity")
    failed = await api.post(D, json={"queue": "bare", "provider": "broken"})
    assert failed.status_code == 502
    assert "out of capacity" in failed.json()["error"]["message"]


async def test_list_and_kill(api: httpx.AsyncClient) -> None:
    await queue(api, "fleet", elastic())
    idle = await hello(api, ["fleet"], tags=["gpu:a10"])
    busy = await hello(api, ["fleet", "other"], capacity=1)
    await submit_many(api, "fleet", 1)
    assert len(await claim(api, busy)) == 1
    listed = (await api.get(D, params={"queue": "fleet"})).json()["daemons"]
    by_id = {d["id"]: d for d in listed}
    assert {wid: d["running"] for wid, d in by_id.items()} == {idle: 0, busy: 1}
    assert by_id[busy]["queues"] == ["fleet", "other"]
    assert (await api.get(D, params={"queue": "ghost"})).status_code == 404
    refused = await api.delete(f"{D}/{busy}")
    assert refused.status_code == 409
    assert "busy" in refused.json()["error"]["message"]
    assert (await api.delete(f"{D}/{idle}")).json() == {"id": idle, "state": "retired"}
    assert (await api.post("/v1/workers/hello", json={"id": idle})).status_code == 410
    assert (await api.delete(f"{D}/{idle}")).status_code == 404
    assert [d["id"] for d in (await api.get(D)).json()["daemons"]] == [busy]


async def test_another_namespace_cannot_see_or_kill(api: httpx.AsyncClient) -> None:
    await queue(api, "mine", elastic())
    worker = await hello(api, ["mine"])
    other = await namespace_token(api, "other")
    assert (await api.get("/v1/namespaces/other/daemons", headers=other)).json() == {"daemons": []}
    gone = await api.delete(f"/v1/namespaces/other/daemons/{worker}", headers=other)
    assert gone.status_code == 404
