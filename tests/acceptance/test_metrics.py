"""``GET /metrics`` of a real server while a real daemon drains a queue: the values move
as the work does, and are the store's."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.acceptance.conftest import LakeshoreServer
from tests.acceptance.test_daemons import NS, http, server, start_daemon, stop

pytestmark = pytest.mark.acceptance

__all__ = ["http", "server"]  # the module-scoped fixtures, shared with test_daemons

CLAIM = "/v1/workers/{worker_id}/claim"


def queue_gauges(http: httpx.Client, queue: str) -> dict[str, float]:
    """The ``lakeshore_queue_*`` samples of one queue, by short name."""
    response = http.get("/metrics")
    assert response.status_code == 200, response.text
    found = {}
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            if s.labels.get("queue") == queue and s.name.startswith("lakeshore_queue_"):
                found[s.name.removeprefix("lakeshore_queue_")] = s.value
    return found


def wait_for(
    http: httpx.Client, queue: str, ok: Callable[[dict[str, float]], bool], within_s: float = 60
) -> dict[str, float]:
    deadline = time.monotonic() + within_s
    while True:
        gauges = queue_gauges(http, queue)
        if ok(gauges) or time.monotonic() > deadline:
            return gauges
        time.sleep(0.2)


def test_metrics_follow_a_queue_being_drained(
    server: LakeshoreServer, http: httpx.Client, tmp_path: Path
) -> None:
    queue = f"metrics-{server.backend}"
    items = [{"fn": "tests.udfs:sleep", "args": [0.2]} for _ in range(12)]
    made = http.post(f"{NS}/queues/{queue}/invocations/batch", json={"invocations": items})
    assert made.status_code == 201, made.text
    before = wait_for(http, queue, lambda g: g.get("pending") == 12)
    assert (before["pending"], before["running"], before["daemons"]) == (12, 0, 0)
    assert before["oldest_pending_age_seconds"] >= 0

    log = tmp_path / "daemon.log"
    daemon = start_daemon(server, log, "--queue", queue, "--capacity", "2")
    try:
        busy = wait_for(http, queue, lambda g: g["running"] > 0 and g["pending"] < 12)
        assert busy["running"] > 0 and busy["pending"] < 12, busy
        assert (busy["daemons"], busy["capacity"]) == (1, 2)
        assert 0 < busy["utilization"] <= 1
        done = wait_for(http, queue, lambda g: g["pending"] == 0 and g["running"] == 0)
        assert (done["pending"], done["running"], done["oldest_pending_age_seconds"]) == (0, 0, 0)
        stats = http.get(f"{NS}/queues/{queue}/stats").json()["byState"]
        assert stats["succeeded"] == 12
    finally:
        stop(daemon)
    text = http.get("/metrics").text
    claims = [
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "lakeshore_http_requests_total" and s.labels["route"] == CLAIM
    ]
    assert sum(claims) >= 1, log.read_text()
