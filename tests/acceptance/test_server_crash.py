"""kill -9 of the server in the middle of a run: after a restart every invocation ends
succeeded, none is lost, and none is completed twice."""

from __future__ import annotations

import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.acceptance.conftest import (
    LAKESHORE,
    WIDE,
    _stop,
    _wait_healthy,
    clean_env,
    free_port,
)
from tests.acceptance.test_daemons import ROOT, all_invocations, stop, wait_for
from tests.conftest import BACKENDS

pytestmark = pytest.mark.acceptance

TOKEN = "lks-crash-test-admin"
NS = "/v1/namespaces/default"


@pytest.fixture(params=BACKENDS)
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield str(tmp_path / "crash.db")
    else:
        yield request.getfixturevalue("fresh_pg_url")


def start_server(db: str, port: int, data_dir: Path, log: Path) -> subprocess.Popen[bytes]:
    env = clean_env(
        COLUMNS=WIDE,
        LAKESHORE_ADMIN_TOKEN=TOKEN,
        LAKESHORE_LEASE_S="5",
        LAKESHORE_REAPER_INTERVAL_S="0.5",
    )
    args = [str(LAKESHORE), "server", "--host", "127.0.0.1", "--port", str(port), "--db", db]
    args += ["--data-dir", str(data_dir), "--log-level", "warning"]
    start = log.stat().st_size if log.exists() else 0
    with log.open("ab") as out:
        process = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env
        )
    try:
        _wait_healthy(process, f"http://127.0.0.1:{port}", log, start)
    except BaseException:
        _stop(process)
        raise
    return process


def start_daemon(url: str, log: Path, queue: str) -> subprocess.Popen[bytes]:
    env = clean_env(LAKESHORE_URL=url, LAKESHORE_TOKEN=TOKEN, PYTHONPATH=str(ROOT))
    with log.open("ab") as out:
        return subprocess.Popen(
            [str(LAKESHORE), "daemon", "run", "--queue", queue, "--capacity", "4"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def succeeded(http: httpx.Client, queue: str) -> int:
    try:
        return int(http.get(f"{NS}/queues/{queue}/stats").json()["byState"]["succeeded"])
    except httpx.TransportError:
        return 0


def report_unfinished(
    http: httpx.Client, queue: str, daemons: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    """What is left when the run does not finish: for the failure's captured output."""
    try:
        print("stats:", http.get(f"{NS}/queues/{queue}/stats").json())
        left = [i for i in all_invocations(http, queue) if i["state"] != "succeeded"]
        for i in left[:20]:
            keys = ("id", "state", "attempts", "worker", "error", "started_at", "lease_expires_at")
            print({k: i.get(k) for k in keys})
    except httpx.HTTPError as exc:
        print("server unreachable:", exc)
    for n, daemon in enumerate(daemons):
        text = (tmp_path / f"daemon-{n}.log").read_text(errors="replace")
        print(f"daemon {n} exit code {daemon.poll()}; log tail:\n{text[-3000:]}")


def test_kill_9_of_the_server_mid_run_loses_nothing(database: str, tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    data_dir, log = tmp_path / "data", tmp_path / "server.log"
    queue = "crash"
    ledger = tmp_path / "ledger.txt"
    server = start_server(database, port, data_dir, log)
    daemons: list[subprocess.Popen[bytes]] = []
    http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    try:
        for start in range(0, 1000, 500):
            items = [
                # 50 ms each: the run lasts seconds, so the kill falls in its middle
                {"fn": "tests.udfs:record", "args": [str(ledger), i, 0.05], "max_attempts": 10}
                for i in range(start, start + 500)
            ]
            response = http.post(
                f"{NS}/queues/{queue}/invocations/batch", json={"invocations": items}
            )
            assert response.status_code == 201, response.text
        daemons = [start_daemon(url, tmp_path / f"daemon-{n}.log", queue) for n in range(2)]
        wait_for(lambda: succeeded(http, queue) >= 200, 120, "200 invocations to finish")

        server.send_signal(signal.SIGKILL)
        server.wait(timeout=10)
        assert 200 <= len(ledger.read_text().split()) < 1000  # killed mid-run

        server = start_server(database, port, data_dir, log)
        try:
            wait_for(lambda: succeeded(http, queue) == 1000, 240, "every invocation to succeed")
        except BaseException:
            report_unfinished(http, queue, daemons, tmp_path)
            raise
    finally:
        for daemon in daemons:
            stop(daemon)
        http.close()
        _stop(server)
        print(log.read_text(errors="replace")[-3000:])

    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}) as check:
        server = start_server(database, port, data_dir, log)
        try:
            done = all_invocations(check, queue)
        finally:
            _stop(server)
    assert len(done) == 1000
    assert all(i["state"] == "succeeded" for i in done)
    assert sorted(i["result"] for i in done) == list(range(1000))
    assert all(i["result"] == i["args"][1] for i in done)
    runs = Counter(int(line) for line in ledger.read_text().split())
    assert set(runs) == set(range(1000))  # each ran at least once; a lost lease may re-run one
    # none completed twice: a second run only follows an attempt the server counted (a
    # lease that lapsed while it was down), never a result recorded and run again
    assert all(runs[i["result"]] <= i["attempts"] for i in done)
