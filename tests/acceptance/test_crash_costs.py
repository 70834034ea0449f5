"""What a daemon's crash costs with ``--prefetch``, through real server and daemon
processes on both stores: only what had begun is charged an attempt, and what the dead
daemon held without beginning goes back to the queue at once (its sentinel reports the
crash), not after a lease.

The server's lease is long (``LEASE_S``): every wait here ends well before a lease could
run out, so what comes back comes back through the sentinel's report."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.acceptance.conftest import WIDE, LakeshoreServer, clean_env, running_server
from tests.acceptance.test_daemons import all_invocations, start_daemon, stop, wait_for
from tests.conftest import BACKENDS, create_pg_database, drop_pg_database

pytestmark = pytest.mark.acceptance

LEASE_S = 300.0  # no lease runs out within a test: what returns, returns by the report
NS = "/v1/namespaces/default"
FINAL = ("succeeded", "failed", "cancelled", "expired")


@pytest.fixture(scope="module", params=BACKENDS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LakeshoreServer]:
    backend: str = request.param
    base = tmp_path_factory.mktemp(f"crashes-{backend}")
    env = clean_env(COLUMNS=WIDE, LAKESHORE_LEASE_S=str(LEASE_S), LAKESHORE_REAPER_INTERVAL_S="0.5")
    db = str(base / "l.db")
    pg_url = None
    if backend == "postgresql":
        pg_url = db = create_pg_database(request.getfixturevalue("pg_server"))
    try:
        with running_server(backend, db, base / "data", base / "server.log", env) as s:
            yield s
    finally:
        if pg_url is not None:
            drop_pg_database(request.getfixturevalue("pg_server"), pg_url)


@pytest.fixture
def http(server: LakeshoreServer) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {server.admin_token}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as client:
        yield client


def submit(http: httpx.Client, queue: str, items: list[dict[str, Any]]) -> list[str]:
    response = http.post(f"{NS}/queues/{queue}/invocations/batch", json={"invocations": items})
    assert response.status_code == 201, response.text
    return [i["id"] for i in response.json()["invocations"]]


def squares(count: int) -> list[dict[str, Any]]:
    """Bystanders with a single attempt: one charged would fail for good."""
    return [{"fn": "tests.udfs:square", "args": [n], "max_attempts": 1} for n in range(count)]


def finished(http: httpx.Client, queue: str) -> dict[str, dict[str, Any]] | None:
    """Every invocation of the queue by id, once all are final."""
    found = {i["id"]: i for i in all_invocations(http, queue)}
    return found if all(i["state"] in FINAL for i in found.values()) else None


def test_a_poison_pill_at_the_head_of_a_prefetched_queue_costs_the_bystanders_nothing(
    server: LakeshoreServer, http: httpx.Client, tmp_path: Path
) -> None:
    """The pill kills its daemon (``--runner thread``: the UDF runs in the daemon) as it
    begins, each time; the daemon is started again on each exit, as a supervisor would.
    The pill is charged each crash and fails once its attempts are spent; the bystanders
    the dead daemons held without beginning are never charged, and all succeed."""
    queue = f"pill-{server.backend}"
    [pill] = submit(http, queue, [{"fn": "tests.udfs:crash", "max_attempts": 2}])
    bystanders = submit(
        http,
        queue,
        [{"fn": "tests.udfs:square", "args": [n], "max_attempts": 1} for n in range(40)],
    )
    flags = ("--queue", queue, "--runner", "thread", "--capacity", "1", "--prefetch", "20")
    crashes = 0
    daemon = start_daemon(server, tmp_path / "daemon.log", *flags)
    try:
        deadline = time.monotonic() + 120
        while (done := finished(http, queue)) is None:
            assert time.monotonic() < deadline, (tmp_path / "daemon.log").read_text()
            if daemon.poll() is not None:  # the pill took it: start it again
                crashes += 1
                daemon = start_daemon(server, tmp_path / "daemon.log", *flags)
            time.sleep(0.1)
        # the last crash may be the last thing that happened: its daemon died before its
        # sentinel reported the pill's last attempt
        crashes += daemon.poll() is not None
    finally:
        stop(daemon)
    assert (done[pill]["state"], done[pill]["attempts"]) == ("failed", 2)
    assert done[pill]["error"]["type"] == "WorkerCrashed"
    assert crashes == 2
    outcomes = {(done[i]["state"], done[i]["attempts"], done[i]["result"]) for i in bystanders}
    assert outcomes == {("succeeded", 1, n * n) for n in range(40)}


def test_a_killed_daemon_s_prefetched_work_returns_at_once_uncharged(
    server: LakeshoreServer, http: httpx.Client, tmp_path: Path
) -> None:
    """``kill -9`` of a daemon running one invocation with many more prefetched: the
    unstarted ones are back in the queue, attempt uncounted, long before a lease could
    run out; the one it ran is charged its attempt; all then succeed elsewhere."""
    queue = f"kill9-{server.backend}"
    marker = tmp_path / "began"
    [held] = submit(
        http,
        queue,
        [{"fn": "tests.udfs_crash:hold_once", "args": [str(marker), 120, -1], "max_attempts": 2}],
    )
    waiting = submit(
        http,
        queue,
        [{"fn": "tests.udfs:square", "args": [n], "max_attempts": 1} for n in range(60)],
    )
    flags = ("--queue", queue, "--capacity", "1", "--prefetch", "100")
    doomed = start_daemon(server, tmp_path / "doomed.log", *flags)
    try:
        wait_for(marker.exists, 60, "the first invocation to begin")
        holding = wait_for(
            lambda: (
                (found := all_invocations(http, queue))
                and all(i["state"] == "running" for i in found)
                and found
            ),
            30,
            "the daemon to hold every invocation",
        )
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(timeout=10)
    finally:
        stop(doomed)
    [dead_worker] = {i["worker"] for i in holding}

    def returned() -> dict[str, dict[str, Any]] | None:
        found = {i["id"]: i for i in all_invocations(http, queue)}
        return found if all(i["state"] == "pending" for i in found.values()) else None

    back = wait_for(returned, 30, "the dead daemon's work back in the queue")  # lease: 300 s
    assert back[held]["attempts"] == 1  # it began: charged
    assert back[held]["error"]["type"] == "WorkerCrashed"
    assert {back[i]["attempts"] for i in waiting} == {0}  # never began: not charged
    daemons = http.get(f"{NS}/daemons").json()
    assert dead_worker not in str(daemons)  # the dead worker is gone, as after a bye

    rescuer = start_daemon(server, tmp_path / "rescuer.log", *flags)
    try:
        done = wait_for(lambda: finished(http, queue), 60, "the work to finish elsewhere")
    finally:
        stop(rescuer)
    assert (done[held]["state"], done[held]["attempts"], done[held]["result"]) == (
        "succeeded",
        2,
        -1,
    )
    outcomes = {(done[i]["state"], done[i]["attempts"], done[i]["result"]) for i in waiting}
    assert outcomes == {("succeeded", 1, n * n) for n in range(60)}
