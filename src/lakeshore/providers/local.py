"""The ``local`` provider: daemons as subprocesses of the server's own machine.

A launch runs the template's setup scripts (each in the working dir, each within its own
time-out, ``setup_timeout_s``; one that fails fails the launch), then starts ``lakeshore
daemon run`` with the launch's queues, runners, capacity and tags, and its server URL,
namespace and worker token in its environment. Its output goes to
``<working dir>/logs/<launch id>.log``. The handle records the pid and the process's start
time (psutil's ``create_time``), so a daemon is found again (and never mistaken for another
process that reused its pid) after a server restart. Terminate sends SIGTERM to the
daemon's process group, gives its members ``grace_s`` to exit, then SIGKILLs the group if
any is left.
Launched daemons exit by themselves once their server has been unreachable for
``orphan_after_s``, so none outlives a server that is gone.

The setup scripts run inside the launch call, so the controller waits for them: up to
``launch_timeout(request)``, a time-out per script of that launch plus the daemon's own
start. The launch's time to say hello (``launch_ttl_s``) counts from when the call
returns, so a slow but working setup is never expired before its daemon could start, and
a daemon that never says hello frees its slot ``launch_ttl_s`` after it was started.
``max_daemons`` counts the live daemons a provider of this name started in this process,
and those adopted from the launch records when ``lakeshore up`` starts again (see
``adopt``).

It runs user code and setup scripts on the server's own machine, so only the admin token
(and ``lakeshore up``, which registers it) may register one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from lakeshore import processes
from lakeshore.providers import base

MAX_OUTPUT_SHOWN = 400


class LocalConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    working_dir: Annotated[str, Field(min_length=1, max_length=4096)] | None = None
    # where launched daemons import UDF modules from (their --path); `lakeshore up` sets its
    # own working directory. An env LAKESHORE_PATH (or the daemon's flags) overrides it.
    code_dir: Annotated[str, Field(min_length=1, max_length=4096)] | None = None
    max_daemons: Annotated[int, Field(ge=1, le=1000)] = 8
    env: dict[str, Annotated[str, Field(max_length=65536)]] = Field(default_factory=dict)
    launch_ttl_s: Annotated[float, Field(gt=0, le=3600)] = 30.0
    boot_s: base.BootSeconds | None = None  # wait_target's boot time until it learns
    setup_timeout_s: Annotated[float, Field(gt=0, le=3600)] = 120.0
    grace_s: Annotated[float, Field(ge=0, le=600)] = 5.0
    orphan_after_s: Annotated[float, Field(ge=1, le=86_400)] = 30.0


def default_working_dir() -> Path:
    from lakeshore.config import Settings

    return Settings().data_dir / "daemons"


def lakeshore_command() -> list[str]:
    """How to start this very installation's CLI."""
    script = Path(sys.executable).parent / "lakeshore"
    if script.exists():
        return [str(script)]
    found = shutil.which("lakeshore")
    return [found] if found else [sys.executable, "-m", "lakeshore.cli.main"]


def alive(handle: Mapping[str, Any]) -> bool:
    """Whether the handle's process still runs (the same process, not a reused pid)."""
    return processes.identified(handle.get("pid"), handle.get("started")) is not None


class LocalProvider:
    kind = "local"

    def __init__(self, name: str, config: LocalConfig) -> None:
        self.name = name
        self.config = config
        self.working_dir = Path(config.working_dir or default_working_dir()).expanduser()
        self.launch_ttl_s = config.launch_ttl_s  # from the call's return (see fleet_ops)

    def launch_timeout(self, request: base.LaunchRequest) -> float:
        """How long the controller waits for this launch: its setup scripts run inside the
        call, each within ``setup_timeout_s``, then the daemon starts."""
        steps = [request.body.bootstrap_script, *request.body.setup_commands]
        scripts = sum(1 for step in steps if step)
        return self.config.setup_timeout_s * scripts + LAUNCH_SLACK_S

    async def launch(self, request: base.LaunchRequest) -> dict[str, Any]:
        running = len(live_daemons(self.name))
        if running >= self.config.max_daemons:
            raise base.LaunchError(
                f'provider "{self.name}" already runs {running} daemons '
                f"(its max_daemons is {self.config.max_daemons})"
            )
        logs = self.working_dir / "logs"
        try:
            logs.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise base.LaunchError(f"cannot use working dir {self.working_dir}: {exc}") from exc
        code = {"LAKESHORE_PATH": self.config.code_dir} if self.config.code_dir else {}
        env = {
            **base.inherited_env(os.environ),
            **code,
            **self.config.env,
            **request.daemon_env(),
        }
        steps = [("bootstrap script", request.body.bootstrap_script)]
        steps += [
            (f"setup script {n}", script)
            for n, script in enumerate(request.body.setup_commands, start=1)
        ]
        for what, script in steps:
            if script:
                await self._setup(what, script, env)
        log_path = logs / f"{request.launch_id}.log"
        args = [
            *request.daemon_args(),
            "--exit-after-unreachable",
            f"{self.config.orphan_after_s:g}",
        ]
        with log_path.open("ab") as log:
            try:
                process = await asyncio.create_subprocess_exec(
                    *lakeshore_command(),
                    *args,
                    cwd=self.working_dir,
                    env=env,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log,
                    stderr=asyncio.subprocess.STDOUT,
                    start_new_session=True,  # Ctrl-C at the terminal is for the server
                )
            except OSError as exc:
                raise base.LaunchError(f"cannot start the daemon: {exc}") from exc
        _CHILDREN.setdefault(self.name, {})[process.pid] = process
        started = processes.start_time(process.pid)
        return {"pid": process.pid, "started": started, "log": str(log_path)}

    async def _setup(self, what: str, script: str, env: dict[str, str]) -> None:
        """Run one step within ``setup_timeout_s``; its process group is killed if it
        overruns, fails, or the launch is given up on (cancelled)."""
        process = await asyncio.create_subprocess_exec(
            "/bin/bash",
            "-c",
            script,
            cwd=self.working_dir,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            async with asyncio.timeout(self.config.setup_timeout_s):
                output, _ = await process.communicate()
        except TimeoutError:
            await _kill_group(process)
            raise base.LaunchError(
                f"{what} ran past the setup time-out ({self.config.setup_timeout_s:g} s)"
            ) from None
        except BaseException:  # the launch was cancelled: leave nothing running
            await _kill_group(process)
            raise
        if process.returncode != 0:
            shown = output.decode(errors="replace").strip()[-MAX_OUTPUT_SHOWN:]
            raise base.LaunchError(f"{what} failed (exit {process.returncode}): {shown}")

    async def terminate(self, handle: Mapping[str, Any], worker_id: str) -> None:
        await stop(handle, grace_s=self.config.grace_s)


LAUNCH_SLACK_S = 10.0  # starting the daemon itself, after the setup scripts
KILL_WAIT_S = 5.0  # for SIGKILLed processes to be gone

# daemons started in this process, per provider name (for max_daemons)
_CHILDREN: dict[str, dict[int, asyncio.subprocess.Process]] = {}
# daemons an earlier server process started, found again in the launch records
_ADOPTED: dict[str, dict[int, Mapping[str, Any]]] = {}


def adopt(provider: str, handle: Mapping[str, Any]) -> bool:
    """Count the daemon behind ``handle`` (started by an earlier server process) among
    ``provider``'s live daemons; whether it is alive (a dead one is not adopted)."""
    if not alive(handle):
        return False
    _ADOPTED.setdefault(provider, {})[int(handle["pid"])] = dict(handle)
    return True


def live_daemons(provider: str) -> list[int]:
    """The pids of ``provider``'s daemons that still run (started here, or adopted)."""
    mine = _CHILDREN.setdefault(provider, {})
    for pid, process in list(mine.items()):
        if process.returncode is not None:
            del mine[pid]
    adopted = _ADOPTED.setdefault(provider, {})
    for pid, handle in list(adopted.items()):
        if pid in mine or not alive(handle):
            del adopted[pid]
    return [*mine, *adopted]


async def _kill_group(process: asyncio.subprocess.Process) -> None:
    _signal_group(process.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        await asyncio.shield(process.wait())


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


async def stop(handle: Mapping[str, Any], *, grace_s: float) -> None:
    """SIGTERM to the daemon's process group, up to ``grace_s`` for its members to exit,
    then SIGKILL to the group if any is left. A process already gone is fine."""
    leader = processes.identified(handle.get("pid"), handle.get("started"))
    if leader is not None:
        members = processes.group_members(leader.pid)  # the leader among them
        _signal_group(leader.pid, signal.SIGTERM)
        left = await processes.wait_gone(members or [leader], grace_s)
        if left:  # the group still has members, so its id cannot have been handed out again
            _signal_group(leader.pid, signal.SIGKILL)
            await processes.wait_gone(left, KILL_WAIT_S)
    await _reap_own(handle.get("pid"))


async def _reap_own(pid: Any) -> None:
    """A daemon this process started is waited for once it is stopped (or found gone), so
    its exit is collected: no zombie is left, and no process object is dropped unwaited.
    (Its pid cannot have been handed out again while it was not yet waited for.)"""
    for children in _CHILDREN.values():
        process = children.get(pid) if isinstance(pid, int) else None
        if process is None:
            continue
        with contextlib.suppress(TimeoutError, ProcessLookupError):
            async with asyncio.timeout(KILL_WAIT_S):
                await process.wait()
        if process.returncode is not None:
            children.pop(pid, None)


def install() -> None:
    base.register("local", base.Kind(config=LocalConfig, factory=LocalProvider, admin_only=True))
