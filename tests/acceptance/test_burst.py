"""A ``--burst`` daemon: it exits once nothing it runs is left and its queues hold no
pending work, retries waiting out their backoff included, and it does not poll the server
in a loop while its work runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from tests.acceptance.conftest import LakeshoreServer
from tests.acceptance.test_daemons import NS, http, server, start_daemon, stop

pytestmark = pytest.mark.acceptance

__all__ = ["http", "server"]  # the module-scoped fixtures, shared with test_daemons


def claims_by(server: LakeshoreServer, worker_id: str) -> int:
    """Claim requests the server logged for one worker."""
    pattern = re.compile(rf'"POST /v1/workers/{re.escape(worker_id)}/claim ')
    return len(pattern.findall(server.log()))


def test_a_burst_daemon_waits_out_a_retry_backoff_before_it_exits(
    server: LakeshoreServer, http: httpx.Client, tmp_path: Path
) -> None:
    queue = f"burst-retry-{server.backend}"
    body = {"fn": "tests.udfs_burst:fails_once", "args": [str(tmp_path / "marker")]}
    created = http.post(f"{NS}/queues/{queue}/invocations", json=body).json()
    daemon = start_daemon(server, tmp_path / "d.log", "--queue", queue, "--burst")
    try:
        assert daemon.wait(timeout=120) == 0, (tmp_path / "d.log").read_text()
    finally:
        stop(daemon)
    final = http.get(f"{NS}/invocations/{created['id']}").json()
    assert (final["state"], final["result"], final["attempts"]) == (
        "succeeded",
        "second time lucky",
        2,
    )


def test_a_burst_daemon_does_not_spin_while_its_work_runs(
    server: LakeshoreServer, http: httpx.Client, tmp_path: Path
) -> None:
    queue = f"burst-slow-{server.backend}"
    worker_id = f"burst-slow-{server.backend}"
    body = {"fn": "tests.udfs:sleep", "args": [2.0]}
    created = http.post(f"{NS}/queues/{queue}/invocations", json=body).json()
    daemon = start_daemon(
        server,
        tmp_path / "d.log",
        "--queue",
        queue,
        "--burst",
        "--capacity",
        "4",  # free slots all the while the one invocation runs
        "--id",
        worker_id,
    )
    try:
        assert daemon.wait(timeout=120) == 0, (tmp_path / "d.log").read_text()
    finally:
        stop(daemon)
    final = http.get(f"{NS}/invocations/{created['id']}").json()
    assert (final["state"], final["result"]) == ("succeeded", 2.0)
    # the first claim, one that waits while the invocation runs, one to see it is done
    assert claims_by(server, worker_id) <= 4, server.log()


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_burst_daemon_ends_with_its_summary_and_exit_code(
    server: LakeshoreServer, http: httpx.Client, tmp_path: Path, log_format: str
) -> None:
    """The daemon ends without the interpreter's teardown once all is reported: what it
    logged last is still written out, and it exits 0."""
    queue = f"burst-summary-{log_format}-{server.backend}"
    for body in (
        {"fn": "tests.udfs:square", "args": [3]},
        {"fn": "tests.udfs:square", "args": [4]},
        {"fn": "tests.udfs:boom", "max_attempts": 1},
    ):
        assert http.post(f"{NS}/queues/{queue}/invocations", json=body).status_code == 201
    log = tmp_path / "d.log"
    args = ("--queue", queue, "--burst", "--log-format", log_format)
    daemon = start_daemon(server, log, *args, PYTHONUNBUFFERED=None)  # as a service runs it
    try:
        assert daemon.wait(timeout=120) == 0, log.read_text()
    finally:
        stop(daemon)
    last = log.read_text().strip().splitlines()[-1]
    assert "daemon stopped: 2 succeeded, 1 failed" in last
    if log_format == "json":
        assert json.loads(last)["message"] == "daemon stopped: 2 succeeded, 1 failed"
