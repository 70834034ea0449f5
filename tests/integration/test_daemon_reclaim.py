"""A report claims the slots the last report's answer freed (their runs end in the turn
of the loop after that answer), not only its own."""

from __future__ import annotations

import json

import httpx

from tests.integration.daemons import Flaky, daemon_for, results, submit


async def test_a_report_sent_at_once_after_an_answer_claims_the_slots_it_freed(
    app_transport: httpx.AsyncBaseTransport,
) -> None:
    """Nothing held ahead, so every slot a report's outcomes free is claimed again by that
    report: no report claims fewer than it reports while work is pending (before, one
    sent right after an answer counted the runs that answer had just settled as still
    running, and claimed nothing for them)."""
    await submit(app_transport, "reclaim", 60)
    recorder = Flaky(app_transport, {})
    daemon = daemon_for(recorder, "reclaim")
    daemon.config.capacity = 4
    daemon.config.prefetch = 0

    assert await daemon.run() == 0

    reports = [json.loads(body) for path, body in recorder.bodies if path.endswith("/results")]
    shapes = [(len(report["results"]), report["claim"]) for report in reports]
    assert all(claim >= reported for reported, claim in shapes), shapes
    assert daemon.completed == 60
    assert await results(app_transport, "reclaim") == [("succeeded", n * n) for n in range(60)]
