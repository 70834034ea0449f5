"""A UDF module with an expensive set-up at import (the warm-state workload of ``bench/peers.py``).

Importing it keeps a CPU busy for ``PEERS_SETUP_S`` seconds (default 0.3), as importing a
large library or loading a model does, then appends one line to the ledger file named by
``PEERS_SETUP_LEDGER`` (when set)::

    setup PID PPID START END

(``time.time()`` before and after the set-up). The benchmark counts the lines and adds up
``END - START``: every process that paid the set-up wrote one line, whatever runner or
pool ran it, so the same count measures a fork per invocation, ``--preload``, or
long-lived children.
"""

from __future__ import annotations

import os
import time

from bench.peers_udf import append_line

SETUP_S = float(os.environ.get("PEERS_SETUP_S", "0.3"))


def _set_up() -> int:
    """Busy work for SETUP_S seconds of wall time; returns the loop count (kept as state)."""
    deadline = time.perf_counter() + SETUP_S
    spins = 0
    while time.perf_counter() < deadline:
        spins += 1
    return spins


_started = time.time()
STATE = _set_up()
_ledger = os.environ.get("PEERS_SETUP_LEDGER")
if _ledger:
    append_line(_ledger, f"setup {os.getpid()} {os.getppid()} {_started:.6f} {time.time():.6f}\n")


def work() -> int:
    """The invocation: uses the state the set-up made; returns this process's id."""
    return os.getpid() if STATE >= 0 else -1
