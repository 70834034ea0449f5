"""``lakeshore up`` and the ``local`` provider through real processes: the demo end to end,
daemons launched and retired by the controller, stopped at shutdown, exiting by themselves
when their server dies, setup scripts run (or failing the launch), and ``local`` admin-only.
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psutil
import pytest

from tests.acceptance.conftest import (
    LAKESHORE,
    WIDE,
    _PortTaken,
    _stop,
    _wait_healthy,
    clean_env,
    free_port,
)

pytestmark = pytest.mark.acceptance

ROOT = Path(__file__).resolve().parents[2]
NS = "/v1/namespaces/default"
T = TypeVar("T")


def wait_for(probe: Callable[[], T], timeout_s: float, what: str, every_s: float = 0.25) -> T:
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


def running(pid: int, started: float | None = None) -> bool:
    """Whether ``pid`` is a live (not zombie) process, started at ``started`` if given."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        return started is None or process.create_time() == started
    except psutil.NoSuchProcess:
        return False


def ancestors() -> set[int]:
    """This process and its parents (never "left behind", never to be killed)."""
    found, pid = set(), os.getpid()
    for _ in range(100):
        if pid <= 1 or pid in found:
            break
        found.add(pid)
        stat = Path(f"/proc/{pid}/stat").read_text()
        pid = int(stat[stat.rfind(")") + 2 :].split()[1])
    return found


def processes_using(path: Path) -> list[int]:
    """Live processes (not this one or its parents) with ``path`` in their command line,
    or their cwd at or under it."""
    found, mine = [], ancestors()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        try:
            cwd = os.readlink(entry / "cwd")
        except OSError:
            cwd = ""
        here = cwd == str(path) or cwd.startswith(f"{path}/")
        if (str(path) in cmdline or here) and running(int(entry.name)):
            found.append(int(entry.name))
    return found


def kill_leftovers(path: Path) -> None:
    """SIGKILL whatever a test started and left running under ``path`` (a failed test's)."""
    for pid in processes_using(path):
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@dataclass
class Up:
    process: subprocess.Popen[bytes]
    url: str
    data_dir: Path
    log_path: Path
    http: httpx.Client

    def stats(self, queue: str) -> dict[str, Any]:
        response = self.http.get(f"{NS}/queues/{queue}/stats")
        assert response.status_code == 200, response.text
        result: dict[str, Any] = response.json()
        return result

    def launches(self, provider: str) -> list[dict[str, Any]]:
        response = self.http.get(f"{NS}/providers/{provider}/launches", params={"limit": 100})
        assert response.status_code == 200, response.text
        result: list[dict[str, Any]] = response.json()["launches"]
        return result

    def events(self, queue: str, verbose: bool = False) -> list[dict[str, Any]]:
        params = {"limit": 100, "verbose": verbose}
        response = self.http.get(f"{NS}/queues/{queue}/events", params=params)
        assert response.status_code == 200, response.text
        result: list[dict[str, Any]] = response.json()["events"]
        return result

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = self.http.post(path, json=body)
        assert response.status_code == 201, response.text
        result: dict[str, Any] = response.json()
        return result


@contextmanager
def lakeshore_up(base: Path, **settings: str) -> Iterator[Up]:
    """``lakeshore up`` on a free port and ``base/data``, ticking every 0.5 s, with
    ``settings`` in its environment; afterwards it is stopped, and anything left running
    under ``base`` is killed."""
    data_dir, log_path = base / "data", base / "up.log"
    env = clean_env(COLUMNS=WIDE, ELASTICITY_INTERVAL_S="0.5", PYTHONPATH=str(ROOT), **settings)
    process = None
    try:
        for _ in range(3):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            args = [str(LAKESHORE), "up", "--host", "127.0.0.1", "--port", str(port)]
            args += ["--data-dir", str(data_dir), "--log-level", "warning"]
            start = log_path.stat().st_size if log_path.exists() else 0
            with log_path.open("ab") as log:
                process = subprocess.Popen(
                    args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    env=env, cwd=base,
                )  # fmt: skip
            try:
                _wait_healthy(process, url, log_path, start)
                break
            except _PortTaken:
                _stop(process)
        else:
            pytest.fail("no free port for lakeshore up after 3 tries")
        token = settings.get("LAKESHORE_ADMIN_TOKEN") or (
            (data_dir / "admin-token").read_text().strip()
        )
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=url, headers=headers, timeout=30) as http:
            yield Up(process, url, data_dir, log_path, http)
    except BaseException:
        print(f"--- lakeshore up log ---\n{log_path.read_text(errors='replace')}")
        raise
    finally:
        if process is not None:
            _stop(process)
        kill_leftovers(base)


def elastic_queue(name: str, low: int, high: int, **extra: Any) -> dict[str, Any]:
    return {"name": name, "elasticity": {"kind": "fully_elastic", "min": low, "max": high}, **extra}


def one_live_daemon(up: Up, queue: str, provider: str) -> dict[str, Any]:
    """Wait until ``queue`` has one daemon; return its launch's handle."""
    wait_for(lambda: up.stats(queue)["daemonCount"] == 1, 60, f"a daemon on {queue}")
    [launch] = [x for x in up.launches(provider) if x["state"] == "succeeded"]
    handle: dict[str, Any] = launch["handle"]
    assert running(handle["pid"], handle["started"]), handle
    return handle


def test_the_demo_runs_and_leaves_nothing_behind(tmp_path: Path) -> None:
    """``lakeshore demo`` with its defaults, as ``make run`` runs it: it exits 0, and its
    closing summary says all 300 invocations succeeded, the fleet peaked at 4 daemons and
    is back to 0, with the scale_up and scale_down decisions; afterwards no process uses
    its scratch dir (command line or cwd) and the dir is gone."""
    env = clean_env(COLUMNS=WIDE, TMPDIR=str(tmp_path))
    scratch = None
    try:
        done = subprocess.run(
            [str(LAKESHORE), "demo"], stdin=subprocess.DEVNULL, capture_output=True, text=True,
            env=env, cwd=tmp_path, timeout=300, check=False,
        )  # fmt: skip
        output = done.stdout + done.stderr
        found = re.search(r"data in (\S+?)\)", output)
        assert found, output
        scratch = Path(found.group(1))
        assert done.returncode == 0, output
        assert re.search(
            r"watch it in a browser: http://127\.0\.0\.1:\d+/ui/ns/default/queues/demo "
            r"\(sign in with this demo's admin token: \S+\)",
            output,
        ), output
        summary = re.search(
            r"(\d+) invocations succeeded, (\d+) failed, in [\d.]+ s; peak daemons (\d+); "
            r"daemons now (\d+) \(\+(\d+) booting\)",
            output,
        )
        assert summary, output
        succeeded, failed, peak, daemons, booting = map(int, summary.groups())
        assert (succeeded, failed) == (300, 0)
        assert peak == 4
        assert (daemons, booting) == (0, 0)
        decisions = output[summary.end() :]
        assert "scale_up" in decisions and "scale_down" in decisions
        assert "stopped the server and its daemons" in output
        assert processes_using(scratch) == []
        assert not scratch.exists()
    finally:
        kill_leftovers(tmp_path)


def test_up_launches_and_retires_local_daemons(tmp_path: Path) -> None:
    """Under ``lakeshore up`` a fully_elastic queue (0-2, provider "local") runs 20
    invocations on daemons the controller launches, then drains to zero: the feed shows
    scale_up and scale_down, every launch succeeded and was terminated, its process gone.
    A namespace token may not register a ``local`` provider (403)."""
    with lakeshore_up(tmp_path) as up:
        names = [p["name"] for p in up.http.get(f"{NS}/providers").json()["providers"]]
        assert "local" in names
        up.post(f"{NS}/queues", elastic_queue("work", 0, 2, providerRef="local"))
        batch = [{"fn": "tests.udfs:sleep", "args": [0.2]} for _ in range(20)]
        up.post(f"{NS}/queues/work/invocations/batch", {"invocations": batch})

        def drained() -> bool:
            now = up.stats("work")
            return (now["byState"]["succeeded"], now["daemonCount"], now["inFlight"]) == (20, 0, 0)

        wait_for(drained, 120, "all 20 done and the fleet back to zero")
        # a retiring daemon no longer counts; its launch is marked once its process stopped
        wait_for(
            lambda: all(x["terminated_at"] for x in up.launches("local")),
            30,
            "every launch terminated",
        )
        actions = {e["action"] for e in up.events("work")}
        assert {"scale_up", "scale_down"} <= actions, actions
        launches = up.launches("local")
        assert launches
        for launch in launches:
            assert launch["state"] == "succeeded", launch
            assert launch["terminated_at"] is not None, launch
            handle = launch["handle"]
            assert not running(handle["pid"], handle["started"]), launch

        up.post("/v1/namespaces", {"name": "team"})
        token = up.post("/v1/namespaces/team/tokens", {})["token"]
        team = {"Authorization": f"Bearer {token}"}
        path = "/v1/namespaces/team/providers"
        body = {"name": "mine", "kind": "local", "config": {}}
        refused = up.http.post(path, json=body, headers=team)
        assert refused.status_code == 403, refused.text
        fake = up.http.post(path, json={**body, "kind": "fake"}, headers=team)
        assert fake.status_code == 201, fake.text  # the token may register other kinds


@pytest.mark.parametrize(
    ("sent", "exit_code"),
    [(signal.SIGINT, 0), (signal.SIGHUP, -signal.SIGTERM)],
    ids=["ctrl-c", "closed-terminal"],
)
def test_shutdown_stops_the_daemons(tmp_path: Path, sent: signal.Signals, exit_code: int) -> None:
    """Ctrl-C (SIGINT) to ``lakeshore up`` with a daemon kept by min 1: it exits 0 and the
    daemon it launched is no longer running. A closed terminal's SIGHUP stops it the same
    way (it used to kill ``up`` at once and leave the daemon running), and it exits as
    after a SIGTERM."""
    with lakeshore_up(tmp_path) as up:
        up.post(f"{NS}/queues", elastic_queue("kept", 1, 1, providerRef="local"))
        handle = one_live_daemon(up, "kept", "local")
        up.process.send_signal(sent)
        try:
            code = up.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"lakeshore up did not exit within 60 s of {sent.name}")
        assert code == exit_code, up.log_path.read_text(errors="replace")
        assert not running(handle["pid"], handle["started"]), handle


def daemons_under(path: Path) -> list[int]:
    """The ``lakeshore daemon run`` processes among :func:`processes_using` ``path``."""
    found = []
    for pid in processes_using(path):
        with suppress(OSError):
            if b"\0daemon\0run\0" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
    return found


def test_a_demo_stopped_by_sigterm_stops_its_server_and_daemons(tmp_path: Path) -> None:
    """``lakeshore demo`` stopped by SIGTERM (as ``timeout`` or a process manager stops
    it) while its daemons run: it stops its ``lakeshore up`` and every daemon, removes its
    scratch dir, says so, and exits 143. It used to die alone and leave them running."""
    env = clean_env(COLUMNS=WIDE, TMPDIR=str(tmp_path))
    out = tmp_path / "demo.out"
    try:
        with out.open("wb") as sink:
            demo = subprocess.Popen(
                [str(LAKESHORE), "demo", "--invocations", "2000", "--seconds", "0.5"],
                stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT, env=env,
                cwd=tmp_path,
            )  # fmt: skip
        try:
            found = wait_for(
                lambda: re.search(r"data in (\S+?)\)", out.read_text(errors="replace")),
                60,
                "the demo's scratch dir",
            )
            scratch = Path(found.group(1))
            # a daemon of its up's running (the daemons' working dir is in the scratch dir)
            wait_for(lambda: daemons_under(scratch), 90, "the demo's daemons")
            demo.send_signal(signal.SIGTERM)
            code = demo.wait(timeout=60)
        finally:
            if demo.poll() is None:
                demo.kill()
                demo.wait(timeout=10)
        output = out.read_text(errors="replace")
        assert code == 128 + signal.SIGTERM, output
        assert "SIGTERM: stopped the server and its daemons" in output
        assert processes_using(scratch) == []
        assert not scratch.exists()
    finally:
        kill_leftovers(tmp_path)


def test_shutdown_lets_the_daemons_report_what_they_ran(tmp_path: Path) -> None:
    """Ctrl-C while a local daemon runs an invocation: the daemon is stopped while the
    server still answers, so it finishes the invocation, reports it and says goodbye,
    instead of finding the server gone and leaving the lease to run out."""
    with lakeshore_up(tmp_path) as up:
        up.post(f"{NS}/queues", elastic_queue("kept", 1, 1, providerRef="local"))
        one_live_daemon(up, "kept", "local")
        body = {"fn": "tests.udfs:sleep", "args": [1.5]}
        invocation = up.post(f"{NS}/queues/kept/invocations", body)["id"]

        def state() -> str:
            response = up.http.get(f"{NS}/invocations/{invocation}")
            assert response.status_code == 200, response.text
            found: str = response.json()["state"]
            return found

        wait_for(lambda: state() == "running", 60, "the invocation to start")
        up.process.send_signal(signal.SIGINT)
        assert up.process.wait(timeout=60) == 0, up.log_path.read_text(errors="replace")
    with sqlite3.connect(tmp_path / "data" / "lakeshore.db") as conn:
        row = conn.execute(
            "SELECT state, result FROM invocations WHERE id = ?", [invocation]
        ).fetchone()
        workers = conn.execute("SELECT count(*) FROM workers").fetchone()[0]
    assert (row[0], float(row[1])) == ("succeeded", 1.5)
    assert workers == 0  # it said goodbye


def test_a_daemon_exits_when_its_server_dies(tmp_path: Path) -> None:
    """A daemon launched through a local provider with ``orphan_after_s`` 2 exits by itself
    once its ``lakeshore up`` is SIGKILLed (nobody is left to stop it)."""
    work = tmp_path / "quick"
    with lakeshore_up(tmp_path) as up:
        config = {"orphan_after_s": 2, "working_dir": str(work)}
        up.post(f"{NS}/providers", {"name": "quick", "kind": "local", "config": config})
        up.post(f"{NS}/queues", elastic_queue("lonely", 1, 1, providerRef="quick"))
        handle = one_live_daemon(up, "lonely", "quick")
        up.process.send_signal(signal.SIGKILL)
        up.process.wait(timeout=10)
        wait_for(
            lambda: not running(handle["pid"], handle["started"]),
            30,
            "the orphaned daemon to exit by itself",
        )
        assert processes_using(work) == []


def test_setup_scripts_run_first_and_a_failing_one_fails_the_launch(tmp_path: Path) -> None:
    """A template's setup script runs in the provider's working dir before the daemon
    starts; one that exits 3 fails the launch (a failed launch row) and the decision is a
    tick_noop naming the script, its exit code and its output."""
    work = tmp_path / "setup-wd"
    with lakeshore_up(tmp_path) as up:
        config = {"working_dir": str(work)}
        up.post(f"{NS}/providers", {"name": "setup", "kind": "local", "config": config})
        good = {"setup_scripts": ["echo ok > setup-ran.txt"], "provider": "setup"}
        up.post(f"{NS}/queues", elastic_queue("prepared", 1, 1, daemonTemplate=good))
        bad = {"setup_scripts": ["echo boom >&2; exit 3"], "provider": "setup"}
        up.post(f"{NS}/queues", elastic_queue("broken", 1, 1, daemonTemplate=bad))

        marker = work / "setup-ran.txt"
        wait_for(marker.exists, 60, "the setup script's file")
        wait_for(lambda: marker.read_text().strip() == "ok", 10, "the setup script's output")
        one_live_daemon(up, "prepared", "setup")

        def failed_noop() -> list[dict[str, Any]]:
            return [
                e
                for e in up.events("broken", verbose=True)
                if e["action"] == "tick_noop" and "setup script 1 failed" in e["reason"]
            ]

        noop = wait_for(failed_noop, 60, "the broken queue's failed launch")[0]
        assert "setup script 1 failed (exit 3)" in noop["reason"], noop
        assert "boom" in noop["reason"], noop
        broken = [x for x in up.launches("setup") if x["scope"] == "broken"]
        assert broken and all(x["state"] == "failed" for x in broken), broken
        assert "setup script 1 failed (exit 3): boom" in broken[0]["error"], broken[0]
        assert all(x["handle"] is None for x in broken), broken


def test_a_udf_run_by_a_launched_daemon_sees_none_of_the_servers_secrets(
    tmp_path: Path,
) -> None:
    """A tenant's UDF dumping ``os.environ`` on a daemon that ``lakeshore up`` launched
    finds neither the admin token nor the database URL, only its own worker token."""
    admin_token = "lks-admin-token-from-the-environment"
    database_url = f"sqlite:///{tmp_path / 'secret-place.db'}"
    with lakeshore_up(
        tmp_path, LAKESHORE_ADMIN_TOKEN=admin_token, LAKESHORE_DATABASE_URL=database_url
    ) as up:
        up.post(f"{NS}/queues", elastic_queue("env", 0, 1, providerRef="local"))
        made = up.post(f"{NS}/queues/env/invocations", {"fn": "tests.udfs:environment"})

        def finished() -> dict[str, Any] | None:
            shown: dict[str, Any] = up.http.get(f"{NS}/invocations/{made['id']}").json()
            return shown if shown["state"] in ("succeeded", "failed") else None

        done = wait_for(finished, 90, "the UDF to run on a launched daemon")
        assert done["state"] == "succeeded", done
        seen: dict[str, str] = done["result"]
        assert admin_token not in seen.values()
        assert not [v for v in seen.values() if "secret-place.db" in v]
        assert "LAKESHORE_ADMIN_TOKEN" not in seen and "LAKESHORE_DATABASE_URL" not in seen
        assert seen["LAKESHORE_TOKEN"] != admin_token
