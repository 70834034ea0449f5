"""``lakeshore.processes`` with real processes: a group's members (a zombie among them, none
of another group), a process told apart from one that reused its pid, a zombie not
running, and this process's resident memory."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import psutil
import pytest

from lakeshore import processes

# a group leader that starts one child that exits at once (a zombie: never reaped) and one
# that sleeps, then says their pids
LEADER = (
    "import subprocess, sys, time; "
    "z = subprocess.Popen(['true']); s = subprocess.Popen(['sleep', '60']); "
    "print(z.pid, s.pid, flush=True); time.sleep(60)"
)


@pytest.fixture
def group() -> Iterator[tuple[subprocess.Popen[str], int, int]]:
    """A process group: (its leader, a zombie member's pid, a sleeping member's pid)."""
    with subprocess.Popen(
        [sys.executable, "-c", LEADER], stdout=subprocess.PIPE, text=True, start_new_session=True
    ) as leader:
        try:
            assert leader.stdout is not None
            zombie, sleeper = (int(pid) for pid in leader.stdout.readline().split())
            yield leader, zombie, sleeper
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(leader.pid, signal.SIGKILL)
            leader.wait(timeout=10)


def test_group_members_are_the_groups_processes_a_zombie_among_them(
    group: tuple[subprocess.Popen[str], int, int],
) -> None:
    leader, zombie, sleeper = group
    for _ in range(200):  # bounded: until `true` has exited
        if psutil.Process(zombie).status() == psutil.STATUS_ZOMBIE:
            break
        time.sleep(0.05)
    members = {process.pid for process in processes.group_members(leader.pid)}
    assert members == {leader.pid, zombie, sleeper}
    assert os.getpid() not in members
    assert not processes.running(psutil.Process(zombie))
    assert processes.running(psutil.Process(sleeper))


def test_a_process_is_identified_by_its_pid_and_start_time_only(
    group: tuple[subprocess.Popen[str], int, int],
) -> None:
    leader, _, _ = group
    started = processes.start_time(leader.pid)
    assert isinstance(started, float)
    found = processes.identified(leader.pid, started)
    assert found is not None and found.pid == leader.pid
    assert processes.identified(leader.pid, started + 0.01) is None  # its pid, reused
    assert processes.identified(leader.pid, None) is None
    assert processes.identified(True, started) is None
    leader.kill()
    leader.wait(timeout=10)
    assert processes.identified(leader.pid, started) is None
    assert processes.start_time(leader.pid) is None


def test_rss_bytes_counts_memory_this_process_touches() -> None:
    before = processes.rss_bytes()
    block = b"\x01" * (64 * 1024 * 1024)  # written: every page resident
    assert processes.rss_bytes() >= before + 32 * 1024 * 1024
    assert len(block) == 64 * 1024 * 1024
