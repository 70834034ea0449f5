"""The poison pill of ``bench/chaos.py --poison-pills``: a function that kills the daemon
running it, every time it runs (imported by daemons as ``bench.chaos_pill``).

It runs in a pool child (the daemon's default runner), whose parent is the daemon: it
records the run in the ledger (``pill N PID PPID TIME``), then sends the daemon SIGKILL,
and the child dies with it (the kernel's parent-death signal).
"""

from __future__ import annotations

import os
import signal
import time

from bench.chaos_udf import _append


def kill_daemon(ledger: str, n: int) -> None:
    """Record the run, then kill the daemon (this process's parent) with SIGKILL."""
    _append(ledger, f"pill {n} {os.getpid()} {os.getppid()} {time.time():.6f}\n")
    os.kill(os.getppid(), signal.SIGKILL)
    time.sleep(60)  # the daemon's death ends this child long before
