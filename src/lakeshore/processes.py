"""Processes by identity and by group, read through psutil (Linux, macOS and the BSDs alike).

- :func:`start_time` and :func:`identified`: a process's start time, and the process
  behind a (pid, start time) pair if it still runs. A pid is handed out again once its
  process is gone; the pair never is, so a process recorded by it (a ``local`` daemon,
  found again after a server restart) is never mistaken for one that reused its pid.
- :func:`running`: whether a process runs; a zombie (exited, its parent not having reaped
  it yet) does not.
- :func:`group_members`: the processes of a process group, zombies included (they are
  still to be reaped).
- :func:`wait_gone`: wait, up to a time, until processes no longer run.
- :func:`rss_bytes`: this process's resident memory now.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os

import psutil

POLL_S = 0.05


def identified(pid: object, started: object) -> psutil.Process | None:
    """The running process ``pid`` if it started at ``started`` (its
    :func:`start_time`), else None."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    if isinstance(started, bool) or not isinstance(started, int | float):
        return None  # none recorded: the process cannot be told apart from a pid reused
    try:
        process = psutil.Process(pid)
        same = process.create_time() == started
    except psutil.Error:
        return None
    return process if same and running(process) else None


def start_time(pid: int) -> float | None:
    """When ``pid`` started (seconds since the epoch, as psutil reads it), None if gone."""
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def running(process: psutil.Process) -> bool:
    """Whether ``process`` (the same one, not a process that reused its pid) still runs."""
    try:
        return bool(process.is_running() and process.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # someone else's, but there
        return True


def group_members(pgid: int) -> list[psutil.Process]:
    """The processes (zombies included) whose process group is ``pgid``."""
    members = []
    for pid in psutil.pids():
        with contextlib.suppress(OSError, psutil.NoSuchProcess):  # gone meanwhile
            if os.getpgid(pid) == pgid:
                members.append(psutil.Process(pid))
    return members


async def wait_gone(processes: list[psutil.Process], within_s: float) -> list[psutil.Process]:
    """Those of ``processes`` still running after up to ``within_s`` seconds.

    Polled rather than ``psutil.wait_procs``: that reaps the server's own children behind
    asyncio's back (which then reports their exit code as 255), and keeps waiting on a
    zombie whose parent does not reap it (PID 1 in many containers) though it has exited.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    left = [process for process in processes if running(process)]
    while left and loop.time() < deadline:
        await asyncio.sleep(POLL_S)
        left = [process for process in left if running(process)]
    return left


def rss_bytes() -> int:
    """Resident memory of this process (read after every invocation a pool child runs:
    the process handle is kept, which halves the cost of a read)."""
    return int(_me(os.getpid()).memory_info().rss)


@functools.cache
def _me(pid: int) -> psutil.Process:
    return psutil.Process(pid)
