"""The ``local`` provider with real processes: setup scripts each within their own time-out
(one past it killed with its process group), the launch TTL covering the setup, the
configured environment reaching scripts and daemons, ``max_daemons`` (counting daemons an
earlier server process launched), terminate's SIGTERM then SIGKILL, and ``alive`` never
taking a reused pid for the daemon.

Daemons launched here report to a closed local port, so they never join anything; each
test stops what it started.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager

from lakeshore import processes
from lakeshore.api.app import create_app
from lakeshore.config import Settings
from lakeshore.domain import fleet
from lakeshore.domain.fleet import LaunchBody
from lakeshore.domain.queue import DaemonTemplate
from lakeshore.providers import LaunchError, LaunchRequest, build, local
from lakeshore.services.fleet.controller import Controller
from lakeshore.store.engine import Store, create_engine_for, parse_url
from tests.conftest import ADMIN, FakeClock

NS = "/v1/namespaces/default"
TICK = "/v1/admin/elasticity/tick"
POLLS = 200  # bounded polls, 0.05 s apart


def closed_url() -> str:
    """A loopback URL nothing listens on (daemons launched here report nowhere)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie has exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].split()[0] not in ("Z", "X")


async def gone(pid: int) -> bool:
    """Wait (bounded) until ``pid`` no longer runs; whether it stopped."""
    for _ in range(POLLS):
        if not running(pid):
            return True
        await asyncio.sleep(0.05)
    return False


def request(launch_id: str = "lch_local1", **body: Any) -> LaunchRequest:
    return LaunchRequest(
        launch_id=launch_id,
        namespace="default",
        scope="jobs",
        server_url=closed_url(),
        token="lks-worker-secret",
        body=LaunchBody(queues=("jobs",), **body),
    )


def provider(name: str, work: Path, **config: Any) -> local.LocalProvider:
    built = build(name, "local", {"working_dir": str(work), **config})
    assert isinstance(built, local.LocalProvider)
    return built


@pytest.fixture(autouse=True)
def fresh_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as a fresh server process would: no daemons counted yet."""
    monkeypatch.setattr(local, "_CHILDREN", {})
    monkeypatch.setattr(local, "_ADOPTED", {})


@pytest.fixture
async def stopped_after() -> AsyncIterator[list[dict[str, Any]]]:
    """Handles a test started; each is stopped (SIGKILL at once) at the end."""
    handles: list[dict[str, Any]] = []
    yield handles
    for handle in handles:
        await local.stop(handle, grace_s=0)


@pytest.fixture
def stand_in() -> Iterator[subprocess.Popen[bytes]]:
    """A process in a session of its own that a handle may point at."""
    process = subprocess.Popen(["sleep", "60"], start_new_session=True)
    yield process
    if process.poll() is None:
        process.kill()
    process.wait(timeout=10)


def handle_of(process: subprocess.Popen[bytes] | asyncio.subprocess.Process) -> dict[str, Any]:
    return {"pid": process.pid, "started": processes.start_time(process.pid)}


# Written to a launched Python process's PYTHONPATH: at its start it writes the
# environment it was given to env-<pid>.json. The process says it itself, so the test does
# not race the process's start (or its end) reading /proc/<pid>/environ.
SAYS_ITS_ENVIRONMENT = """\
import json, os
with open(f"env-{os.getpid()}.json.part", "w") as out:
    json.dump(dict(os.environ), out)
os.replace(f"env-{os.getpid()}.json.part", f"env-{os.getpid()}.json")
"""


def log_of(handle: dict[str, Any]) -> str:
    return Path(handle["log"]).read_text(errors="replace")


async def environment_said(work: Path, handle: dict[str, Any]) -> dict[str, str]:
    """The environment the daemon behind ``handle`` says it started with (bounded wait);
    its log is shown if it never says."""
    said = work / f"env-{handle['pid']}.json"
    for _ in range(POLLS):
        if said.exists():
            found: dict[str, str] = json.loads(said.read_text())
            return found
        await asyncio.sleep(0.05)
    log = log_of(handle)[-2000:]
    raise AssertionError(f"daemon {handle['pid']} never said its environment; log:\n{log}")


# --- setup scripts and the launch's time limits -------------------------------------------


def test_the_controller_waits_for_each_setup_script_of_the_launch() -> None:
    """A local launch runs its setup scripts inside the call: the controller waits a
    setup time-out per script of that launch, plus the daemon's start."""
    made = local.LocalProvider("p", local.LocalConfig(launch_ttl_s=30, setup_timeout_s=120))
    bare = LaunchRequest("lch_1", "default", "q", "http://x", "t", fleet.launch_body(None, ["q"]))
    assert made.launch_timeout(bare) == local.LAUNCH_SLACK_S
    scripted = fleet.launch_body(
        DaemonTemplate(bootstrap_script="true", setup_scripts=["true", "true"]), ["q"]
    )
    three = LaunchRequest("lch_2", "default", "q", "http://x", "t", scripted)
    assert made.launch_timeout(three) == 3 * 120 + local.LAUNCH_SLACK_S
    assert made.launch_ttl_s == 30  # counted from the call's return


async def test_each_setup_script_gets_its_own_time_out(
    tmp_path: Path, stopped_after: list[dict[str, Any]]
) -> None:
    """Three steps of 2 s each under a 3 s ``setup_timeout_s``: together they take longer
    than one time-out, yet each stays within its own, so the daemon starts."""
    local_provider = provider("steps", tmp_path, setup_timeout_s=3)
    launch = request(
        bootstrap_script="sleep 2; echo boot >> steps.txt",
        setup_commands=("sleep 2; echo one >> steps.txt", "sleep 2; echo two >> steps.txt"),
    )
    handle = await local_provider.launch(launch)
    stopped_after.append(handle)
    assert (tmp_path / "steps.txt").read_text().split() == ["boot", "one", "two"]
    assert local.alive(handle)


async def test_a_script_past_its_time_out_fails_the_launch_and_leaves_no_process(
    tmp_path: Path,
) -> None:
    """A setup script still running after ``setup_timeout_s`` fails the launch, naming the
    step and the time-out; it and what it started (its process group) are killed, the next
    step never runs and no daemon starts."""
    local_provider = provider("hung", tmp_path, setup_timeout_s=2)
    hung = "sleep 60 & echo $! > child.pid; echo $$ > script.pid; wait"
    launch = request(setup_commands=("echo first >> ran.txt", hung, "echo third >> ran.txt"))
    with pytest.raises(LaunchError) as failed:
        await local_provider.launch(launch)
    assert str(failed.value) == "setup script 2 ran past the setup time-out (2 s)"
    for name in ("script.pid", "child.pid"):
        pid = int((tmp_path / name).read_text())
        assert await gone(pid), f"{name}: {pid} still runs"
    assert (tmp_path / "ran.txt").read_text().split() == ["first"]
    assert not (tmp_path / "logs" / "lch_local1.log").exists()
    assert local.live_daemons("hung") == []


async def test_the_config_env_reaches_the_setup_scripts_and_the_daemon(
    tmp_path: Path, stopped_after: list[dict[str, Any]]
) -> None:
    """``env`` is added to the scripts' and the daemon's environment, beside the launch's
    own URL, namespace and worker token."""
    env = {"LAKESHORE_TEST_MARK": "hello there", "PYTHONPATH": str(tmp_path)}
    (tmp_path / "sitecustomize.py").write_text(SAYS_ITS_ENVIRONMENT)
    local_provider = provider("env", tmp_path, env=env)
    launch = request(setup_commands=('printf %s "$LAKESHORE_TEST_MARK" > mark.txt',))
    handle = await local_provider.launch(launch)
    stopped_after.append(handle)
    assert (tmp_path / "mark.txt").read_text() == "hello there"
    daemon_env = await environment_said(tmp_path, handle)
    assert daemon_env["LAKESHORE_TEST_MARK"] == "hello there"
    assert daemon_env["PYTHONPATH"] == str(tmp_path)
    assert daemon_env["LAKESHORE_TOKEN"] == "lks-worker-secret"
    assert daemon_env["LAKESHORE_URL"] == launch.server_url
    assert daemon_env["LAKESHORE_NAMESPACE"] == "default"


async def test_the_daemon_and_its_scripts_see_none_of_the_servers_secrets(
    tmp_path: Path, stopped_after: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's admin token, database URL and cloud credentials are not passed on:
    launched daemons (and the UDFs they run) get an allow-list of the environment."""
    secrets = {
        "LAKESHORE_ADMIN_TOKEN": "lks-admin-very-secret",
        "LAKESHORE_DATABASE_URL": "postgresql://app:hunter2@db/lakeshore",
        "AWS_SECRET_ACCESS_KEY": "aws-secret",
        "SOME_OTHER_SETTING": "not-on-the-allow-list",
    }
    for key, value in secrets.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    (tmp_path / "sitecustomize.py").write_text(SAYS_ITS_ENVIRONMENT)
    local_provider = provider("secrets", tmp_path, env={"PYTHONPATH": str(tmp_path)})
    launch = request(setup_commands=("env > script-env.txt",))
    handle = await local_provider.launch(launch)
    stopped_after.append(handle)
    script_env = (tmp_path / "script-env.txt").read_text()
    daemon_env = await environment_said(tmp_path, handle)
    for key, value in secrets.items():
        assert key not in daemon_env
        assert value not in script_env
    assert daemon_env["PATH"] and daemon_env["LC_ALL"] == "C.UTF-8"
    assert daemon_env["LAKESHORE_TOKEN"] == "lks-worker-secret"  # its own worker token


# --- max_daemons ----------------------------------------------------------------------


async def test_max_daemons_refuses_a_launch_beyond_it_until_one_stops(
    tmp_path: Path, stopped_after: list[dict[str, Any]]
) -> None:
    local_provider = provider("solo", tmp_path, max_daemons=1)
    first = await local_provider.launch(request("lch_first"))
    stopped_after.append(first)
    with pytest.raises(LaunchError) as refused:
        await local_provider.launch(request("lch_second"))
    assert str(refused.value) == 'provider "solo" already runs 1 daemons (its max_daemons is 1)'
    assert not (tmp_path / "logs" / "lch_second.log").exists()
    # another provider's daemons are not this one's
    other = await provider("other", tmp_path, max_daemons=1).launch(request("lch_other"))
    stopped_after.append(other)
    await local.stop(first, grace_s=5)
    third = await local_provider.launch(request("lch_third"))
    stopped_after.append(third)
    assert local.live_daemons("solo") == [third["pid"]]


async def test_adopted_daemons_count_toward_max_daemons(
    tmp_path: Path, stand_in: subprocess.Popen[bytes]
) -> None:
    """A daemon an earlier server process started (here a stand-in) counts once adopted;
    one that no longer runs is not adopted, and an adopted one that stops no longer counts."""
    handle = handle_of(stand_in)
    assert not local.adopt("solo", {**handle, "started": handle["started"] + 1})
    assert local.adopt("solo", handle)
    assert local.live_daemons("solo") == [stand_in.pid]
    with pytest.raises(LaunchError, match=r"already runs 1 daemons \(its max_daemons is 1\)"):
        await provider("solo", tmp_path, max_daemons=1).launch(request())
    stand_in.kill()
    stand_in.wait(timeout=10)
    assert local.live_daemons("solo") == []


@pytest.fixture
def local_settings(settings: Settings) -> Settings:
    """The test server's settings, its launches reporting to a closed port."""
    return settings.model_copy(update={"public_url": closed_url()})


def started(settings: Settings, clock: FakeClock, **options: Any) -> LifespanManager:
    """The app in-process (``local_fleet=True`` as ``lakeshore up`` runs it)."""
    return LifespanManager(create_app(settings, clock=clock, **options))


def client(manager: LifespanManager) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=manager.app)
    return httpx.AsyncClient(transport=transport, base_url="http://lakeshore.test", headers=ADMIN)


async def created(api: httpx.AsyncClient, path: str, body: dict[str, Any]) -> None:
    response = await api.post(path, json=body)
    assert response.status_code == 201, response.text


async def tick(api: httpx.AsyncClient, scope: str) -> dict[str, Any]:
    response = await api.post(TICK)
    assert response.status_code == 200, response.text
    [decision] = [d for d in response.json()["decisions"] if d["scope"] == scope]
    return dict(decision)


async def launches(api: httpx.AsyncClient, name: str) -> list[dict[str, Any]]:
    response = await api.get(f"{NS}/providers/{name}/launches")
    assert response.status_code == 200, response.text
    return list(response.json()["launches"])


def kept_queue(name: str, provider_name: str, **template: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": name,
        "elasticity": {"kind": "fully_elastic", "min": 1, "max": 1},
        "providerRef": provider_name,
    }
    if template:
        body["daemonTemplate"] = template
    return body


async def test_lakeshore_up_restarted_counts_the_daemons_launched_before(
    local_settings: Settings, clock: FakeClock, tmp_path: Path
) -> None:
    """A server launches a daemon through a local provider with ``max_daemons`` 1 and
    dies without stopping it; the ``lakeshore up`` started next on the same store adopts
    it, so a second queue's launch through that provider is refused (a tick_noop naming
    max_daemons); at shutdown that ``lakeshore up`` stops the adopted daemon."""
    config = {"working_dir": str(tmp_path / "work"), "max_daemons": 1}
    async with started(local_settings, clock) as first, client(first) as api:
        await created(api, f"{NS}/providers", {"name": "solo", "kind": "local", "config": config})
        await created(api, f"{NS}/queues", kept_queue("kept", "solo"))
        assert (await tick(api, "kept"))["action"] == "scale_up"
        [launch] = await launches(api, "solo")
    handle = launch["handle"]
    children = local._CHILDREN.pop("solo")  # a new server process starts with none
    try:
        assert local.alive(handle)
        async with (
            started(local_settings, clock, local_fleet=True) as second,
            client(second) as api,
        ):
            assert local.live_daemons("solo") == [handle["pid"]]
            await created(api, f"{NS}/queues", kept_queue("more", "solo"))
            decision = await tick(api, "more")
            assert decision["action"] == "tick_noop", decision
            assert decision["reason"].endswith(
                'launch failed: provider "solo" already runs 1 daemons (its max_daemons is 1)'
            )
            assert [x["scope"] for x in await launches(api, "solo")].count("kept") == 1
        assert await gone(handle["pid"])
    finally:
        await local.stop(handle, grace_s=0)
        await children[handle["pid"]].wait()


async def test_a_launch_whose_setup_outlasts_the_configured_ttl_is_not_expired(
    local_settings: Settings, clock: FakeClock, tmp_path: Path
) -> None:
    """Through the controller: while its setup runs, a launch is in flight for the setup's
    whole time-out plus the TTL; once the call returns, the TTL counts from then. A tick
    past that expires it and stops its daemon."""
    work = tmp_path / "work"
    config = {"working_dir": str(work), "launch_ttl_s": 1, "setup_timeout_s": 30}
    async with started(local_settings, clock) as manager, client(manager) as api:
        await created(api, f"{NS}/providers", {"name": "slow", "kind": "local", "config": config})
        template = {"setup_scripts": ["sleep 0.5; echo ready > ready.txt"]}
        await created(api, f"{NS}/queues", kept_queue("prepared", "slow", **template))
        store = Store(create_engine_for(parse_url(local_settings.resolved_database_url)))
        controller = Controller(store, clock=clock, server_url="http://127.0.0.1:9")
        try:
            first = await controller.tick(budget_s=0.0)  # the setup is still running
            assert "prepared" not in {d["scope"] for d in first}
            [running] = await launches(api, "slow")
            created_at = datetime.fromisoformat(running["created_at"])
            expires_at = datetime.fromisoformat(running["expires_at"])
            waited = 30 + local.LAUNCH_SLACK_S  # one script's time-out, the daemon's start
            assert (expires_at - created_at).total_seconds() == waited + 1
            clock.advance(1 + 1)  # the configured TTL passes while the setup runs
            assert (await tick(api, "prepared"))["action"] != "scale_up"
            launch = running
            for _ in range(200):  # the call returns once the script is done
                [launch] = await launches(api, "slow")
                if launch["handle"]:
                    break
                await asyncio.sleep(0.05)
            handle = launch["handle"]
            assert handle, launch
            assert (work / "ready.txt").read_text().strip() == "ready"
            assert launch["state"] == "in_flight"
            expires_at = datetime.fromisoformat(launch["expires_at"])
            assert expires_at == clock() + timedelta(seconds=1)  # the TTL, from the return
            clock.advance(2)
            await tick(api, "prepared")
            expired = [x for x in await launches(api, "slow") if x["id"] == launch["id"]]
            assert expired[0]["state"] == "expired", expired
            assert await gone(handle["pid"])
        finally:
            await controller.close()
            await store.close()
            for made in await launches(api, "slow"):  # a relaunch after the expiry too
                if made["handle"]:
                    await local.stop(made["handle"], grace_s=0)


# --- terminate and alive -----------------------------------------------------------------


async def test_terminate_sends_sigterm_then_sigkill_after_the_grace(tmp_path: Path) -> None:
    """A daemon stand-in that ignores SIGTERM (noting that it got one) is killed with
    SIGKILL once ``grace_s`` has passed."""
    ready, marker = tmp_path / "ready", tmp_path / "got-term"
    script = f'trap "echo term > {marker}" TERM; touch {ready}; while :; do sleep 0.1; done'
    process = await asyncio.create_subprocess_exec("bash", "-c", script, start_new_session=True)
    try:
        for _ in range(POLLS):  # its trap is set
            if ready.exists():
                break
            await asyncio.sleep(0.05)
        handle = handle_of(process)
        await provider("p", tmp_path, grace_s=1).terminate(handle, "wrk_1")
        assert await asyncio.wait_for(process.wait(), timeout=10) == -signal.SIGKILL
        assert marker.read_text().strip() == "term"
        assert not local.alive(handle)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_terminate_of_a_daemon_that_obeys_sigterm_sends_nothing_more(
    tmp_path: Path, stand_in: subprocess.Popen[bytes]
) -> None:
    await provider("p", tmp_path, grace_s=30).terminate(handle_of(stand_in), "wrk_1")
    assert stand_in.wait(timeout=10) == -signal.SIGTERM


async def test_alive_and_stop_never_take_a_reused_pid_for_the_daemon(
    tmp_path: Path, stand_in: subprocess.Popen[bytes]
) -> None:
    """A handle whose start time is not the process's own names another process (the
    daemon's pid reused): it is not alive, and terminating it leaves that process be."""
    handle = handle_of(stand_in)
    assert local.alive(handle)
    reused = {**handle, "started": handle["started"] + 1}
    assert not local.alive(reused)
    await provider("p", tmp_path, grace_s=0).terminate(reused, "wrk_1")
    assert stand_in.poll() is None and running(stand_in.pid)
    assert not local.alive({"pid": "12"})
    assert not local.alive({"pid": 0, "started": 1})
    assert not local.alive({})
    unknown = {"pid": stand_in.pid, "started": None}  # no start time: cannot be told apart
    assert not local.alive(unknown)
    await provider("p", tmp_path, grace_s=0).terminate(unknown, "wrk_1")
    assert stand_in.poll() is None and running(stand_in.pid)
    stand_in.kill()
    stand_in.wait(timeout=10)
    assert not local.alive(handle)


IGNORES_SIGTERM = (
    "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ready', flush=True); time.sleep(60)"
)


async def test_terminate_kills_a_group_member_that_outlives_the_daemon(tmp_path: Path) -> None:
    """The daemon (its group's leader) obeys SIGTERM, but a process it started in its group
    ignores it: after ``grace_s`` that process is SIGKILLed too, not left behind."""
    leader_code = (
        "import subprocess, sys, time; "
        f"p = subprocess.Popen([sys.executable, '-c', {IGNORES_SIGTERM!r}], "
        "stdout=subprocess.PIPE, text=True); "
        "assert p.stdout.readline() == 'ready\\n'; print(p.pid, flush=True); time.sleep(60)"
    )
    leader = await asyncio.create_subprocess_exec(
        sys.executable, "-c", leader_code, stdout=asyncio.subprocess.PIPE, start_new_session=True
    )
    member = 0
    try:
        assert leader.stdout is not None
        async with asyncio.timeout(30):
            member = int(await leader.stdout.readline())
        assert os.getpgid(member) == leader.pid and running(member)
        await provider("p", tmp_path, grace_s=1).terminate(handle_of(leader), "wrk_1")
        async with asyncio.timeout(10):
            assert await leader.wait() == -signal.SIGTERM
        assert await gone(member)
    finally:
        if member and running(member):
            os.kill(member, signal.SIGKILL)
        if leader.returncode is None:
            leader.kill()
            await leader.wait()
