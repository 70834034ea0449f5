"""The elasticity controller through real processes: the CLI end to end, the loop ticking
by itself, a real daemon retired by a scale-down, and leader failover between two server
replicas on one PostgreSQL database."""

from __future__ import annotations

import secrets
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from tests.acceptance.conftest import (
    LAKESHORE,
    WIDE,
    Cli,
    LakeshoreServer,
    _spawn,
    _stop,
    clean_env,
    running_server,
)
from tests.conftest import BACKENDS, create_pg_database, drop_pg_database

pytestmark = pytest.mark.acceptance

ROOT = Path(__file__).resolve().parents[2]
NS = "/v1/namespaces/default"
TICK = "/v1/admin/elasticity/tick"
T = TypeVar("T")


@pytest.fixture(scope="module", params=BACKENDS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LakeshoreServer]:
    """One server per backend with the loop off: only the ticks a test asks for run."""
    backend: str = request.param
    base = tmp_path_factory.mktemp(f"controller-{backend}")
    env = clean_env(COLUMNS=WIDE, ELASTICITY_ENABLED="false")
    if backend == "sqlite":
        with running_server(
            backend, str(base / "l.db"), base / "data", base / "server.log", env
        ) as s:
            yield s
        return
    pg_server: str = request.getfixturevalue("pg_server")
    db_url = create_pg_database(pg_server)
    try:
        with running_server(backend, db_url, base / "data", base / "server.log", env) as s:
            yield s
    finally:
        drop_pg_database(pg_server, db_url)


def connect(url: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


@pytest.fixture
def http(server: LakeshoreServer) -> Iterator[httpx.Client]:
    with connect(server.url, server.admin_token) as client:
        yield client


def wait_for(probe: Callable[[], T], timeout_s: float, what: str, every_s: float = 0.1) -> T:
    """Poll ``probe`` (bounded in time and count) until it returns something truthy."""
    deadline = time.monotonic() + timeout_s
    for _ in range(int(timeout_s / every_s) + 1):
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            break
        time.sleep(every_s)
    pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}")


def submit_many(http: httpx.Client, queue: str, count: int) -> None:
    items = [{"fn": "tests.udfs:noop"} for _ in range(count)]
    response = http.post(f"{NS}/queues/{queue}/invocations/batch", json={"invocations": items})
    assert response.status_code == 201, response.text


def only_decision(decisions: list[dict[str, Any]], scope: str) -> dict[str, Any]:
    """The one decision of this tick for ``scope`` in the default namespace."""
    found = [d for d in decisions if d["scope"] == scope and d["namespace"] == "default"]
    assert len(found) == 1, decisions
    return found[0]


def test_the_controller_through_the_cli(cli: Cli, http: httpx.Client) -> None:
    """Register a fake provider and an elastic queue with the CLI, submit 5, then tick:
    the table shows the launch and its reason, ``--json`` one decision for the queue, the
    feed its scale_up rows, explain a "why:" line; a namespace token may not tick."""
    added = cli.run("providers", "add", "fk", "--kind", "fake")
    assert added.returncode == 0, added
    queue = cli.run(
        "queues", "add", "fleet", "--elasticity", "fully-elastic",
        "--min", "0", "--max", "3", "--provider", "fk", "--json",
    ).json()  # fmt: skip
    assert queue["providerRef"] == "fk"
    assert (queue["elasticity"]["kind"], queue["elasticity"]["max"]) == ("fully_elastic", 3)
    submit_many(http, "fleet", 5)

    table = cli.run("controller", "tick")
    assert table.returncode == 0, table
    [row] = [line for line in table.stdout.splitlines() if " fleet " in line]
    assert "scale_up" in row
    assert "target 3 > daemons 0 + in flight 0 → launch" in row

    decision = only_decision(cli.run("controller", "tick", "--json").json()["decisions"], "fleet")
    assert decision["action"] == "scale_up"
    assert decision["reason"] == "target 3 > daemons 0 + in flight 1 → launch"
    assert decision["launch_id"]

    events = cli.run("queues", "events", "fleet")
    assert events.returncode == 0, events
    assert len([line for line in events.stdout.splitlines() if "scale_up" in line]) == 2
    assert "in flight 0 → launch" in events.stdout and "in flight 1 → launch" in events.stdout

    explained = cli.run("queues", "explain", "fleet")
    assert explained.returncode == 0, explained
    assert any(line.startswith("why: ") for line in explained.stdout.splitlines())
    assert "latest decision" in explained.stdout and "scale_up" in explained.stdout

    issued = cli.run("tokens", "create", "--namespace", "default", "--json").json()
    refused = cli.run("controller", "tick", token=issued["token"])
    assert refused.returncode != 0, refused
    assert len(refused.stderr.strip().splitlines()) == 1, refused
    assert "admin token" in refused.message and "403" in refused.message
    assert "Traceback" not in refused.stdout + refused.stderr
    launched = http.get(f"{NS}/providers/fk/launches").json()["launches"]
    assert len(launched) == 2  # the refused tick launched nothing


def test_the_feed_shows_folded_noops_once_with_their_count(cli: Cli) -> None:
    """Three ticks of a steady queue: one feed row, its count (3, or more, if the server's own
    loop ticked too), with its first and last time."""
    assert cli.run("queues", "add", "steady").returncode == 0
    for _ in range(3):
        assert cli.run("controller", "tick").returncode == 0
    rows = cli.run("queues", "events", "steady", "--verbose", "--json").json()["events"]
    assert len(rows) == 1 and rows[0]["repeats"] >= 3
    table = cli.run("queues", "events", "steady", "--verbose")
    [row] = [line for line in table.stdout.splitlines() if "fixed: no-op" in line]
    assert f"\u00d7{rows[0]['repeats']}" in row and "→" in row


def test_the_loop_scales_up_by_itself(tmp_path: Path) -> None:
    """With the loop on (every 0.3 s) and nobody calling the tick route, an elastic queue
    with pending work gets a scale_up in its feed and a launch through its provider."""
    env = clean_env(COLUMNS=WIDE, ELASTICITY_ENABLED="true", ELASTICITY_INTERVAL_S="0.3")
    with (
        running_server(
            "sqlite", str(tmp_path / "l.db"), tmp_path / "data", tmp_path / "s.log", env
        ) as srv,
        connect(srv.url, srv.admin_token) as http,
    ):
        body = {"name": "fk", "kind": "fake", "config": {}}
        assert http.post(f"{NS}/providers", json=body).status_code == 201
        spec = {"kind": "fully_elastic", "min": 0, "max": 2}
        created = http.post(
            f"{NS}/queues", json={"name": "auto", "elasticity": spec, "providerRef": "fk"}
        )
        assert created.status_code == 201, created.text
        submit_many(http, "auto", 3)

        def scaled_up() -> list[dict[str, Any]]:
            events = http.get(f"{NS}/queues/auto/events").json()["events"]
            return [e for e in events if e["action"] == "scale_up"]

        first = wait_for(scaled_up, 20, "the loop's first scale_up", every_s=0.2)
        assert first[-1]["reason"] == "target 2 > daemons 0 + in flight 0 → launch"
        launched = http.get(f"{NS}/providers/fk/launches").json()["launches"]
        assert launched and all(launch["body"]["queues"] == ["auto"] for launch in launched)


def start_daemon(server: LakeshoreServer, log: Path, *args: str) -> subprocess.Popen[bytes]:
    env = clean_env(
        LAKESHORE_URL=server.url, LAKESHORE_TOKEN=server.admin_token, PYTHONPATH=str(ROOT)
    )
    with log.open("ab") as out:
        return subprocess.Popen(
            [str(LAKESHORE), "daemon", "run", *args], cwd=ROOT, env=env,
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


def stop_daemon(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=40)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def test_a_scale_down_retires_a_real_daemon(
    server: LakeshoreServer, http: httpx.Client, tmp_path: Path
) -> None:
    """An idle daemon on a queue made fully_elastic min 0 is the tick's scale_down victim;
    it exits by itself with code 0, and its id is refused at hello (410) afterwards."""
    worker = f"shrink-{server.backend}-{secrets.token_hex(3)}"
    log = tmp_path / "daemon.log"
    daemon = start_daemon(server, log, "--queue", "shrink", "--id", worker)
    try:

        def one_daemon() -> bool:
            assert daemon.poll() is None, log.read_text()
            response = http.get(f"{NS}/queues/shrink/stats")
            return response.status_code == 200 and response.json()["daemonCount"] == 1

        wait_for(one_daemon, 30, "the daemon's hello")
        spec = {"elasticity": {"kind": "fully_elastic", "min": 0}}
        patched = http.patch(f"{NS}/queues/shrink", json=spec)
        assert patched.status_code == 200, patched.text
        response = http.post(TICK)
        assert response.status_code == 200, response.text
        decision = only_decision(response.json()["decisions"], "shrink")
        assert decision["action"] == "scale_down", decision
        assert decision["victim"] == worker
        assert decision["reason"] == "daemons 1 > target 0 and > min 0 → kill one"
        try:
            code = daemon.wait(timeout=45)  # its running claim ends, the next one gets 410
        except subprocess.TimeoutExpired:
            pytest.fail(f"the retired daemon did not exit:\n{log.read_text()}")
        assert code == 0, log.read_text()
    finally:
        stop_daemon(daemon)
    assert "retired by the control plane" in log.read_text()
    again = http.post("/v1/workers/hello", json={"id": worker, "queues": ["shrink"]})
    assert again.status_code == 410, again.text
    assert http.get(f"{NS}/queues/shrink/stats").json()["daemonCount"] == 0


def tick_status(url: str, token: str) -> int:
    with connect(url, token) as http:
        return http.post(TICK).status_code


def newest_event(url: str, token: str, queue: str) -> tuple[datetime, int]:
    """When a queue's newest decision row was first written, and the ticks folded into it."""
    with connect(url, token) as http:
        response = http.get(f"{NS}/queues/{queue}/events", params={"verbose": "true", "limit": 1})
        assert response.status_code == 200, response.text
        events = response.json()["events"]
        if not events:
            return datetime.min.replace(tzinfo=UTC), 0
        return datetime.fromisoformat(events[0]["createdAt"]), int(events[0]["repeats"])


def test_a_surviving_replica_takes_over_the_controller(pg_server: str, tmp_path: Path) -> None:
    """Two replicas on one database, both with the loop on: exactly one leads (its tick
    route answers 200, the other's 409); SIGKILL the leader, and the survivor's own loop
    takes the advisory lock and ticks: new decisions appear in the feed with no tick asked
    for by hand (the leader is dead, so they are the survivor's)."""
    env = clean_env(COLUMNS=WIDE, ELASTICITY_ENABLED="true", ELASTICITY_INTERVAL_S="0.5")
    db_url = create_pg_database(pg_server)
    try:
        with running_server("postgresql", db_url, tmp_path / "a", tmp_path / "a.log", env) as a:
            env_b = {**env, "LAKESHORE_ADMIN_TOKEN": a.admin_token}
            b_process, b_url = _spawn(db_url, tmp_path / "b", tmp_path / "b.log", env_b)
            try:
                urls = {a.url: a.process, b_url: b_process}
                with connect(a.url, a.admin_token) as http:
                    body = {"name": "watched", "elasticity": {"kind": "fully_elastic"}}
                    assert http.post(f"{NS}/queues", json=body).status_code == 201

                def one_leader() -> dict[str, int] | None:
                    codes = {url: tick_status(url, a.admin_token) for url in urls}
                    return codes if sorted(codes.values()) == [200, 409] else None

                codes = wait_for(one_leader, 20, "exactly one leader", every_s=0.25)
                [leader] = [url for url, code in codes.items() if code == 200]
                [survivor] = [url for url in urls if url != leader]
                # taken before the kill: the survivor may lead, tick and write its first
                # row before anything read after the kill comes back, and its next
                # identical no-ops fold into that row, which is then never "newer"
                killed_at = datetime.now(UTC)
                urls[leader].send_signal(signal.SIGKILL)
                urls[leader].wait(timeout=10)

                def survivor_ticked_twice() -> bool:
                    # the survivor's first tick writes a row of its own (it has folded
                    # nothing yet); its next identical no-op folds into that row. A row
                    # first written after the kill began is the survivor's: the leader
                    # could not have written a second tick into it before it died
                    first_at, repeats = newest_event(survivor, a.admin_token, "watched")
                    return first_at > killed_at and repeats >= 2

                wait_for(
                    survivor_ticked_twice, 30, "the survivor's loop to tick by itself", every_s=0.1
                )
                assert urls[survivor].poll() is None
            except BaseException:
                print(f"--- server B log ---\n{(tmp_path / 'b.log').read_text(errors='replace')}")
                raise
            finally:
                _stop(b_process)
    finally:
        drop_pg_database(pg_server, db_url)
