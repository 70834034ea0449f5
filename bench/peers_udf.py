"""The functions ``bench/peers.py`` runs, the same on Lakeshore, PgQueuer and Procrastinate.

Lakeshore daemons import this module as ``bench.peers_udf`` (the repository root on their
``PYTHONPATH``); the PgQueuer and Procrastinate workers of ``bench/peers_pgq.py`` and
``bench/peers_procrastinate.py`` call the same functions from their handlers.
"""

from __future__ import annotations

import os
import time


def append_line(path: str, line: str) -> None:
    """Append one line with a single ``write(2)`` on an ``O_APPEND`` descriptor.

    Lines written by processes running at once never interleave.
    """
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def noop() -> None:
    """The drain's job: nothing at all."""
    return None


def stamp(ledger: str, tag: str) -> float:
    """The latency probe: append ``TAG TIME`` (``time.time()`` as the body starts)."""
    now = time.time()
    append_line(ledger, f"{tag} {now:.6f}\n")
    return now
