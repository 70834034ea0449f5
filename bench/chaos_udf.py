"""The UDF of ``bench/chaos.py``: a function that records each run of its own body.

Daemons import it as ``bench.chaos_udf`` (the repository root on their ``PYTHONPATH``).
Each run appends two lines to the ledger file: ``start N PID PPID TIME`` when the body
begins and ``end N PID PPID TIME`` when it is done (PPID is the daemon that forked the
child; TIME is ``time.time()``). Each line is one ``write(2)`` on a descriptor opened
with ``O_APPEND``, so the lines of children running at once never interleave, and a
child killed between the two writes leaves its ``start`` line alone.
"""

from __future__ import annotations

import os
import time


def _append(ledger: str, line: str) -> None:
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def record_run(ledger: str, n: int, work_s: float = 0.0) -> int:
    """Record the run, work ``work_s`` seconds (a sleep), record its end; returns ``n``."""
    who = f"{n} {os.getpid()} {os.getppid()}"
    _append(ledger, f"start {who} {time.time():.6f}\n")
    time.sleep(work_s)
    _append(ledger, f"end {who} {time.time():.6f}\n")
    return n
