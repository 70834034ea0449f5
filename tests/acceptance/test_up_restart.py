"""``lakeshore up`` killed and started again on the same data dir and port: the daemon the
first run launched keeps serving the queue, the second run launches no other, and stops
that daemon when it stops."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.acceptance.conftest import LAKESHORE, WIDE, _stop, _wait_healthy, clean_env, free_port
from tests.acceptance.test_up_and_local import (
    NS,
    ROOT,
    Up,
    elastic_queue,
    kill_leftovers,
    one_live_daemon,
    running,
    wait_for,
)

pytestmark = pytest.mark.acceptance

TICKS_AFTER_RESTART = 6


@contextmanager
def up_on(base: Path, port: int) -> Iterator[Up]:
    """``lakeshore up`` on ``port`` and ``base/data``, ticking every 0.3 s; stopped after the
    block unless the test stopped it."""
    data_dir, log_path = base / "data", base / "up.log"
    env = clean_env(COLUMNS=WIDE, ELASTICITY_INTERVAL_S="0.3", PYTHONPATH=str(ROOT))
    url = f"http://127.0.0.1:{port}"
    args = [str(LAKESHORE), "up", "--host", "127.0.0.1", "--port", str(port)]
    args += ["--data-dir", str(data_dir), "--log-level", "warning"]
    start = log_path.stat().st_size if log_path.exists() else 0
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
            cwd=base,
        )  # fmt: skip
    try:
        _wait_healthy(process, url, log_path, start)
        token = (data_dir / "admin-token").read_text().strip()
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=url, headers=headers, timeout=30) as http:
            yield Up(process, url, data_dir, log_path, http)
    except BaseException:
        print(f"--- lakeshore up log ---\n{log_path.read_text(errors='replace')}")
        raise
    finally:
        _stop(process)


def latest_event_id(up: Up, queue: str) -> int:
    events = up.events(queue, verbose=True)
    return max((int(e["id"]) for e in events), default=0)


def events_since(up: Up, queue: str, since: int) -> list[dict[str, Any]]:
    params: dict[str, Any] = {"verbose": True, "since": since, "limit": 100}
    response = up.http.get(f"{NS}/queues/{queue}/events", params=params)
    assert response.status_code == 200, response.text
    found: list[dict[str, Any]] = response.json()["events"]
    return [e for e in found if int(e["id"]) > since]


def test_a_restarted_up_keeps_the_daemon_it_finds_and_stops_it_at_shutdown(
    tmp_path: Path,
) -> None:
    """A queue kept at one daemon (``fully_elastic`` min 1 max 1, provider ``local``):
    ``lakeshore up`` is SIGKILLed and started again on the same data dir; over several
    ticks of the new run the queue still has that one daemon, no second launch is made
    and no decision scales up; SIGTERM to the new run stops the daemon the first launched."""
    port = free_port()
    try:
        with up_on(tmp_path, port) as first:
            first.post(f"{NS}/queues", elastic_queue("kept", 1, 1, providerRef="local"))
            handle = one_live_daemon(first, "kept", "local")
            [launch] = first.launches("local")
            seen = latest_event_id(first, "kept")
            first.process.send_signal(signal.SIGKILL)
            first.process.wait(timeout=10)
        assert running(handle["pid"], handle["started"]), "the daemon died with its server"

        with up_on(tmp_path, port) as second:

            def ticked() -> list[dict[str, Any]]:
                # identical consecutive no-ops fold into one row: count the ticks in them
                found = events_since(second, "kept", seen)
                ticks = sum(int(e["repeats"]) for e in found)
                return found if ticks >= TICKS_AFTER_RESTART else []

            after = wait_for(ticked, 60, f"{TICKS_AFTER_RESTART} ticks of the restarted run")
            assert [e for e in after if e["action"] == "scale_up"] == [], after
            assert [x["id"] for x in second.launches("local")] == [launch["id"]]
            stats = second.stats("kept")
            assert (stats["daemonCount"], stats["inFlight"]) == (1, 0), stats
            assert running(handle["pid"], handle["started"])

            second.process.send_signal(signal.SIGTERM)
            try:
                code = second.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pytest.fail("lakeshore up did not exit within 60 s of SIGTERM")
            # after a clean shutdown uvicorn re-raises the signal, so the exit tells of it
            log = second.log_path.read_text(errors="replace")
            assert code in (0, -signal.SIGTERM), log
            assert "Traceback" not in log, log
        # stopped by the second run's shutdown: well before it would exit by itself
        # (orphan_after_s, 30 s, after its server went away)
        wait_for(
            lambda: not running(handle["pid"], handle["started"]),
            10,
            "the first run's daemon to be stopped",
        )
    finally:
        kill_leftovers(tmp_path)
