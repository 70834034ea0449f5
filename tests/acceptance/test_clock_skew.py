"""One replica's clock does not stall the cluster (issue 36, item 3).

Two ``lakeshore server`` replicas on one PostgreSQL database, the second under a clock 90 s
ahead (libfaketime, Debian's ``faketime``): past the 30 s lease and the 60 s worker
liveness. A daemon works through the first. Every replica reaps; on its own clock the
second took back every lease the first granted and dropped its workers within a sweep.
On the database's clock, nothing is taken back: each job succeeds at its first attempt,
the worker is never dropped, and the skewed replica says loudly how far off it is."""

from __future__ import annotations

import glob
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.acceptance.conftest import (
    LAKESHORE,
    WIDE,
    LakeshoreServer,
    _spawn,
    _stop,
    clean_env,
    running_server,
)

pytestmark = pytest.mark.acceptance

ROOT = Path(__file__).resolve().parents[2]
NS = "/v1/namespaces/default"
AHEAD_S = 90  # past the lease (30 s) and the worker liveness (60 s)
JOBS, JOB_S = 4, 3.0  # each job outlasts a few of the reaper's 1 s sweeps


@pytest.fixture
def libfaketime() -> str:
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    if not found:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("libfaketime is missing under CI=true (.ci/run installs faketime)")
        pytest.skip("libfaketime is not installed (apt-get install faketime)")
    return found[0]


@pytest.fixture
def two_replicas(
    fresh_pg_url: str, tmp_path: Path, libfaketime: str
) -> Iterator[tuple[LakeshoreServer, Path]]:
    """Replica A on this machine's clock, and B, AHEAD_S ahead, on one database; yields A
    and B's log."""
    env = clean_env(COLUMNS=WIDE)
    with running_server("postgresql", fresh_pg_url, tmp_path / "a", tmp_path / "a.log", env) as a:
        skewed = {
            **env,
            "LAKESHORE_ADMIN_TOKEN": a.admin_token,
            "LD_PRELOAD": libfaketime,
            "FAKETIME": f"+{AHEAD_S}s",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }
        b_log = tmp_path / "b.log"
        process, _ = _spawn(fresh_pg_url, tmp_path / "b", b_log, skewed)
        try:
            yield a, b_log
        except BaseException:
            print(f"--- replica B log ---\n{b_log.read_text(errors='replace')}")
            raise
        finally:
            _stop(process)


@pytest.fixture
def daemon(two_replicas: tuple[LakeshoreServer, Path], tmp_path: Path) -> Iterator[Path]:
    """A daemon working through replica A; yields its log."""
    a, _ = two_replicas
    log = tmp_path / "daemon.log"
    env = clean_env(LAKESHORE_URL=a.url, LAKESHORE_TOKEN=a.admin_token, PYTHONPATH=str(ROOT))
    args = ["daemon", "run", "-q", "skew", "--capacity", str(JOBS), "--id", "steady"]
    with log.open("ab") as out:
        process = subprocess.Popen(
            [str(LAKESHORE), *args], cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        yield log
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=40)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def _registered(http: httpx.Client) -> list[tuple[str, str]]:
    """The daemons (id, registered at), once there is one."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        daemons = http.get(f"{NS}/daemons").json()["daemons"]
        if daemons:
            return [(d["id"], d["createdAt"]) for d in daemons]
        time.sleep(0.1)
    pytest.fail("the daemon did not say hello")


def test_a_replica_ahead_of_the_database_reaps_no_lease_and_drops_no_worker(
    two_replicas: tuple[LakeshoreServer, Path], daemon: Path
) -> None:
    a, b_log = two_replicas
    headers = {"Authorization": f"Bearer {a.admin_token}"}
    with httpx.Client(base_url=a.url, headers=headers, timeout=30) as http:
        registered = _registered(http)
        ids = []
        for _ in range(JOBS):
            body = {"fn": "tests.udfs:sleep", "args": [JOB_S], "max_attempts": 3}
            created = http.post(f"{NS}/queues/skew/invocations", json=body)
            assert created.status_code == 201, created.text
            ids.append(created.json()["id"])
        deadline, rows = time.monotonic() + 60, []
        while time.monotonic() < deadline:
            rows = [http.get(f"{NS}/invocations/{i}").json() for i in ids]
            if all(row["state"] in ("succeeded", "failed") for row in rows):
                break
            time.sleep(0.2)
        assert _registered(http) == registered  # the same row: never dropped
    assert [(row["state"], row["attempts"]) for row in rows] == [("succeeded", 1)] * JOBS, rows
    assert "no longer knows this worker" not in daemon.read_text(errors="replace")
    b = b_log.read_text(errors="replace")
    warned = re.search(r"this server's clock is (\d+\.\d+) s ahead of the database's", b)
    assert warned is not None, b
    assert AHEAD_S - 2 < float(warned.group(1)) < AHEAD_S + 2
    assert "reaper: " not in b  # no sweep of B's took anything back or dropped anyone
