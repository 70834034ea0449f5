"""The few Linux process controls a daemon uses (``prctl``); elsewhere each does nothing.

- :func:`die_with_parent`: the kernel signals this process when the thread that started it
  ends, so a daemon killed with SIGKILL takes its children with it.
- :func:`become_subreaper`: processes orphaned below the daemon (a UDF's own children whose
  parent exited) are re-parented to the daemon rather than to PID 1, so it can reap them.

A process group's members are read through psutil, in :mod:`lakeshore.processes`; a
pool child's resident memory, read after each invocation, from ``/proc/self/statm``
(:func:`rss_bytes`) where there is one, so that a child imports psutil only if a UDF
leaves processes behind.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
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


_statm: list[int] = []  # this process's /proc/self/statm, kept open: one pread a read


def rss_bytes() -> int:
    """This process's resident memory now."""
    try:
        if not _statm or _statm[0] != os.getpid():
            _statm[:] = [os.getpid(), os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)]
        return int(os.pread(_statm[1], 256, 0).split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        from lakeshore import processes

        return processes.rss_bytes()
