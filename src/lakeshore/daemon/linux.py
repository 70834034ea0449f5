"""The few Linux process controls a daemon uses (``prctl``); elsewhere each does nothing.

- :func:`die_with_parent`: the kernel signals this process when the thread that started it
  ends, so a daemon killed with SIGKILL takes its children with it.
- :func:`become_subreaper`: processes orphaned below the daemon (a UDF's own children whose
  parent exited) are re-parented to the daemon rather than to PID 1, so it can reap them.
- :func:`group_members`: the processes of a process group, read from ``/proc``.
- :func:`rss_bytes`: this process's resident memory now.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import sys

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def set_parent_death_signal(sig: int) -> bool:
    """Have the kernel send ``sig`` to this process when the thread that started it ends
    (the daemon starts children from threads that live as long as it does)."""
    return _prctl(_PR_SET_PDEATHSIG, sig)


def die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when its parent dies; a parent already gone before the request
    took effect ends this process now."""
    if set_parent_death_signal(signal.SIGKILL) and os.getppid() != parent_pid:
        os._exit(1)  # reparented already: the daemon died as it started this process


def become_subreaper() -> bool:
    """Adopt this process's orphaned descendants (Linux); whether it took effect."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def group_members(pgid: int) -> list[int]:
    """The processes (zombies included) whose process group is ``pgid``; [] without
    ``/proc``."""
    members = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                text = stat.read()
        except OSError:  # gone meanwhile
            continue
        # "pid (comm) state ppid pgrp …": comm may hold spaces and parentheses
        fields = text[text.rfind(b")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def rss_bytes() -> int:
    """Resident memory of this process (``/proc/self/statm``; elsewhere its peak)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024
