"""A delayed submit through a real server and a real, idle, long-polling daemon: its body
starts no earlier than its due time, and soon after it (the daemon's claim, waiting
already, wakes when the invocation falls due rather than at its next re-check)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from lakeshore.sdk import Client, udf
from tests import udfs_delays
from tests.acceptance.conftest import LAKESHORE, Cli, LakeshoreServer, clean_env
from tests.acceptance.test_daemons import stop, wait_for

pytestmark = pytest.mark.acceptance

ROOT = Path(__file__).resolve().parents[2]
NS = "/v1/namespaces/default"
DELAY_S = 2.0
# within a second of its due time (25 probes on a loaded machine: at most 51 ms late on
# SQLite, 93 ms on PostgreSQL, submit latency included; docs/benchmarks.md)
SOON_S = 1.0


@pytest.fixture(scope="module")
def http(server: LakeshoreServer) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {server.admin_token}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def idle_daemon(
    server: LakeshoreServer, http: httpx.Client, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A daemon long-polling an empty queue (its first invocation done: it is warm); each
    test leaves it idle again."""
    tmp_path = tmp_path_factory.mktemp(f"delays-{server.backend}")
    queue = f"delays-{server.backend}"
    env = clean_env(
        LAKESHORE_URL=server.url,
        LAKESHORE_TOKEN=server.admin_token,
        PYTHONPATH=f"{ROOT / 'src'}:{ROOT}",
    )
    with (tmp_path / "daemon.log").open("ab") as out:
        daemon = subprocess.Popen(
            [str(LAKESHORE), "daemon", "run", "--queue", queue, "--capacity", "2"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        warm = _submit(http, queue, {})
        wait_for(lambda: _read(http, warm)["state"] == "succeeded", 60, "the warm-up invocation")
        yield queue
    finally:
        stop(daemon)


def _submit(http: httpx.Client, queue: str, delay: dict[str, Any]) -> str:
    body = {"fn": "tests.udfs_delays:began", **delay}
    answer = http.post(f"{NS}/queues/{queue}/invocations", json=body)
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def _read(http: httpx.Client, invocation_id: str) -> dict[str, Any]:
    return dict(http.get(f"{NS}/invocations/{invocation_id}").json())


def _stats(http: httpx.Client, queue: str) -> tuple[int, int]:
    answer = http.get(f"{NS}/queues/{queue}/stats").json()
    return answer["pending"], answer["scheduled"]


def test_a_delayed_submit_starts_on_an_idle_daemon_at_its_due_time(
    server: LakeshoreServer, http: httpx.Client, idle_daemon: str
) -> None:
    before = time.time()
    invocation = _submit(http, idle_daemon, {"delay_s": DELAY_S})
    assert _stats(http, idle_daemon) == (0, 1)
    done = wait_for(
        lambda: (got := _read(http, invocation))["state"] == "succeeded" and got,
        30,
        "the delayed invocation",
    )
    began = float(done["result"])
    assert began >= before + DELAY_S, "started before its due time"
    assert began < before + DELAY_S + SOON_S, f"started {began - before - DELAY_S:.2f} s late"
    assert _stats(http, idle_daemon) == (0, 0)


def test_the_cli_submits_with_a_delay_and_a_time(
    cli: Cli, http: httpx.Client, idle_daemon: str
) -> None:
    before = time.time()
    delayed = cli.run("submit", idle_daemon, "tests.udfs_delays:began", "--delay", "2s")
    assert delayed.returncode == 0, delayed.stderr
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(before + 3))
    timed = cli.run("submit", idle_daemon, "tests.udfs_delays:began", "--not-before", at)
    assert timed.returncode == 0, timed.stderr
    both = cli.run("submit", idle_daemon, "m:f", "--delay", "2s", "--not-before", at)
    assert both.returncode != 0 and "not both" in both.stderr
    bad = cli.run("submit", idle_daemon, "m:f", "--not-before", "tomorrow")
    assert bad.returncode != 0 and "RFC 3339" in bad.stderr + bad.stdout
    for line, due in ((delayed.stdout, before + 2), (timed.stdout, float(int(before + 3)))):
        invocation = line.strip()
        done = wait_for(
            lambda i=invocation: (got := _read(http, i))["state"] == "succeeded" and got,
            30,
            "the delayed invocation",
        )
        assert float(done["result"]) >= due


def test_the_sdk_submits_with_a_delay_and_a_time(server: LakeshoreServer, idle_daemon: str) -> None:
    with Client(server.url, server.admin_token) as client:
        began = udf(queue=idle_daemon, client=client)(udfs_delays.began)
        before = time.time()
        delayed = began.submit(_delay=2)
        timed = client.submit(
            idle_daemon,
            "tests.udfs_delays:began",
            not_before=datetime.fromtimestamp(before + 3, UTC),
        )
        with pytest.raises(ValueError, match="not both"):
            began.submit(_delay=1, _not_before=datetime.now(UTC))
        with pytest.raises(ValueError, match="aware"):
            began.submit(_not_before=datetime.now())  # naive on purpose
        assert delayed.result(timeout=30) >= before + 2
        assert timed.result(timeout=30) >= before + 3
