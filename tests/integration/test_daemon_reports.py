"""The daemon reports outcomes in batches that also claim the freed slots again."""

from __future__ import annotations

import json

import httpx

from lakeshore.daemon.prefetch import CEILING
from tests.integration.daemons import ADMIN, NS, Flaky, daemon_for, results, submit


async def test_outcomes_go_out_through_batched_reports_that_claim_again(
    app_transport: httpx.AsyncBaseTransport,
) -> None:
    await submit(app_transport, "reports", 40)
    recorder = Flaky(app_transport, {})
    daemon = daemon_for(recorder, "reports")
    daemon.config.capacity = 4
    daemon.config.prefetch = 0  # nothing held ahead: a batch is at most its capacity

    assert await daemon.run() == 0

    paths = [path.rsplit("/", 1)[1] for path, _ in recorder.bodies]
    assert "complete" not in paths and "fail" not in paths
    reports = [json.loads(body) for path, body in recorder.bodies if path.endswith("/results")]
    reported = [item["id"] for report in reports for item in report["results"]]
    assert len(reported) == len(set(reported)) == 40
    assert all(0 < len(report["results"]) <= 4 for report in reports)
    assert any(report["claim"] > 0 for report in reports)
    assert daemon.completed == 40
    assert await results(app_transport, "reports") == [("succeeded", n * n) for n in range(40)]


async def test_with_no_prefetch_given_a_daemon_of_tiny_invocations_learns_to_claim_ahead(
    app_transport: httpx.AsyncBaseTransport,
) -> None:
    """Unset, the prefetch is learned (daemon/prefetch.py): the hello declares the most
    it may hold ahead, nothing is held ahead at first, and once it has timed runs far
    shorter than a report's round trip its reports claim beyond its one slot."""
    await submit(app_transport, "learns", 300)
    recorder = Flaky(app_transport, {})
    daemon = daemon_for(recorder, "learns")
    daemon.config.capacity = 1
    daemon.config.runner = "thread"  # in process: a run takes microseconds

    assert await daemon.run() == 0

    hello = next(json.loads(body) for path, body in recorder.bodies if path.endswith("/hello"))
    assert hello["capabilities"]["prefetch"] == CEILING
    claims = [json.loads(body)["max"] for path, body in recorder.bodies if path.endswith("/claim")]
    assert claims[0] == 1  # before any run was timed: its one slot only
    reports = [json.loads(body) for path, body in recorder.bodies if path.endswith("/results")]
    assert max(report["claim"] for report in reports) > 1  # held ahead of its one slot
    assert daemon.completed == 300


async def test_a_result_the_server_will_not_store_fails_the_attempt_for_good(
    app_transport: httpx.AsyncBaseTransport,
) -> None:
    async with httpx.AsyncClient(
        transport=app_transport,
        base_url="http://lakeshore.test",
        headers={"Authorization": f"Bearer {daemon_for(app_transport, 'x').config.token}"},
    ) as http:
        body = {"fn": "tests.udfs:big_result", "args": [600_000], "max_attempts": 3}
        created = (
            await http.post("/v1/namespaces/default/queues/big/invocations", json=body)
        ).json()
        daemon = daemon_for(app_transport, "big")
        assert await daemon.run() == 0
        final = (await http.get(f"/v1/namespaces/default/invocations/{created['id']}")).json()
    assert (final["state"], final["attempts"], final["error"]["type"]) == (
        "failed",
        1,
        "ResultTooLarge",
    )
    assert "LAKESHORE_MAX_RESULT_BYTES" in final["error"]["message"]
    assert (daemon.completed, daemon.failed) == (0, 1)


async def test_a_result_goes_to_the_server_as_the_child_wrote_it(
    app_transport: httpx.AsyncBaseTransport,
) -> None:
    """The daemon passes a result's JSON text on undecoded: past 64 bits, non-ASCII text
    and nesting arrive as the function returned them."""
    value = [2**70, -(2**65), "ünïcødé ✓", {"a": [1.5, None, True]}, 10**400]
    async with httpx.AsyncClient(
        transport=app_transport, base_url="http://lakeshore.test", headers=ADMIN
    ) as http:
        response = await http.post(
            f"{NS}/queues/verbatim/invocations", json={"fn": "tests.udfs:echo", "args": value}
        )
        assert response.status_code == 201, response.text
    recorder = Flaky(app_transport, {})
    assert await daemon_for(recorder, "verbatim").run() == 0

    reports = [json.loads(body) for path, body in recorder.bodies if path.endswith("/results")]
    assert [item["result"] for report in reports for item in report["results"]] == [
        {"args": value, "kwargs": {}}
    ]
    assert await results(app_transport, "verbatim") == [
        ("succeeded", {"args": value, "kwargs": {}})
    ]
