"""The ``lakeshore server`` process itself: restarts, shutdown, and what it prints at start.

Each test here starts its own server(s), so it can stop and restart them.
"""

from __future__ import annotations

import signal
import sqlite3
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.acceptance.conftest import Cli, clean_env, running_server
from tests.conftest import BACKENDS

pytestmark = pytest.mark.acceptance


@pytest.fixture(params=BACKENDS)
def store_db(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    """(backend, --db value): a SQLite file path, or an empty PostgreSQL database."""
    backend: str = request.param
    if backend == "sqlite":
        return backend, str(tmp_path / "lakeshore.db")
    fresh_pg_url: str = request.getfixturevalue("fresh_pg_url")
    return backend, fresh_pg_url


def test_restarted_server_keeps_its_admin_token_and_queues_after_a_graceful_sigterm(
    store_db: tuple[str, str], tmp_path: Path
) -> None:
    backend, db = store_db
    data_dir, log_path = tmp_path / "data", tmp_path / "server.log"
    scratch = tmp_path / "cli-data"
    scratch.mkdir()

    with running_server(backend, db, data_dir, log_path) as first:
        cli = Cli(first.url, first.admin_token, scratch)
        cli.run("queues", "add", "kept", "--elasticity", "max-count", "--max", "2", "--json").json()
        assert cli.run("queues", "pause", "kept", "--json").json()["state"] == "paused"
    # graceful: the app's shutdown ran; uvicorn then re-raises the SIGTERM it caught
    assert first.process.returncode in (0, -signal.SIGTERM), first.log()
    assert "Application shutdown complete" in first.log()

    with running_server(backend, db, data_dir, log_path) as second:
        assert second.admin_token == first.admin_token
        assert stat.S_IMODE(second.admin_token_path.stat().st_mode) == 0o600
        cli = Cli(second.url, second.admin_token, scratch)
        queue = cli.run("queues", "show", "kept", "--json").json()
        assert queue["state"] == "paused"
        assert queue["elasticity"] == {"kind": "max_count", "max": 2}


@pytest.mark.parametrize(
    "data_dir_name",
    [
        pytest.param("data[red]dir", id="brackets"),
        pytest.param("d" * 60 + "/data", id="long"),
    ],
)
def test_server_prints_the_admin_token_path_verbatim(data_dir_name: str, tmp_path: Path) -> None:
    data_dir, log_path = tmp_path / data_dir_name, tmp_path / "server.log"
    env = clean_env(COLUMNS=None)  # as under systemd, docker or `> server.log`

    with running_server("sqlite", str(tmp_path / "lakeshore.db"), data_dir, log_path, env) as srv:
        assert srv.admin_token_path.is_file()
        assert f"admin token: {srv.admin_token_path}" in srv.log().splitlines()


def test_a_graceful_stop_answers_a_waiting_claim_at_once(tmp_path: Path) -> None:
    """SIGTERM while a daemon's claim long-polls (up to 20 s): a graceful stop waits for
    the requests still open, so the claim is answered at once, with nothing, and the
    server exits. (``lakeshore up`` took 20 s to stop its daemons that way.)"""
    db = tmp_path / "lakeshore.db"
    with running_server("sqlite", str(db), tmp_path / "data", tmp_path / "server.log") as srv:
        headers = {"Authorization": f"Bearer {srv.admin_token}"}
        with httpx.Client(base_url=srv.url, headers=headers, timeout=30) as http:
            hello = http.post("/v1/workers/hello", json={"queues": ["q"]})
            worker = hello.json()["id"]
            seen = _last_seen(db, worker)
            with ThreadPoolExecutor(1) as pool:
                body = {"timeout_s": 20}
                # bounded: the claim would wait 20 s; read within 15
                claiming = pool.submit(
                    http.post, f"/v1/workers/{worker}/claim", json=body, timeout=15
                )
                for _ in range(500):  # until the server is serving the claim
                    if _last_seen(db, worker) != seen or claiming.done():
                        break
                    time.sleep(0.01)
                assert not claiming.done(), claiming.result().text
                srv.process.send_signal(signal.SIGTERM)
                answer = claiming.result()
        assert answer.status_code == 200, answer.text
        assert answer.json()["invocations"] == []
        assert srv.process.wait(timeout=15) in (0, -signal.SIGTERM), srv.log()
    assert "Waiting for connections to close" not in srv.log()


@pytest.mark.parametrize("sent", [signal.SIGHUP, signal.SIGQUIT], ids=["hup", "quit"])
def test_sighup_and_sigquit_stop_the_server_gracefully_and_sigusr1_2_do_not_stop_it(
    tmp_path: Path, sent: signal.Signals
) -> None:
    """SIGUSR1 writes the threads' stacks to the log and SIGUSR2 is logged, the server
    serving on; a closed terminal's SIGHUP, or SIGQUIT, stops it as SIGTERM does (the
    app's shutdown runs) and it exits as after a SIGTERM. All four used to kill it at
    once."""
    db = tmp_path / "lakeshore.db"
    with running_server("sqlite", str(db), tmp_path / "data", tmp_path / "server.log") as srv:
        srv.process.send_signal(signal.SIGUSR1)
        srv.process.send_signal(signal.SIGUSR2)
        for _ in range(100):  # bounded: until both are in the log
            if "SIGUSR2: ignored" in srv.log() and "(most recent call first)" in srv.log():
                break
            time.sleep(0.05)
        assert httpx.get(f"{srv.url}/healthz", timeout=5).status_code == 200
        assert srv.process.poll() is None

        srv.process.send_signal(sent)
        code = srv.process.wait(timeout=15)
    log = srv.log()
    assert code == -signal.SIGTERM, log
    assert f"{sent.name}: stopping as for SIGTERM" in log
    assert "Application shutdown complete" in log
    assert "SIGUSR2: ignored" in log
    assert "(most recent call first)" in log  # SIGUSR1's stacks


def _last_seen(db: Path, worker: str) -> object:
    """The worker's last sign of life in the store: a claim touches it first."""
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT last_seen_at FROM workers WHERE id = ?", [worker]).fetchone()
