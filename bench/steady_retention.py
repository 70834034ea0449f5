"""Retention under a steady load: does the store stop growing?

For SQLite and/or PostgreSQL, a real ``lakeshore server`` with its retention sweep every
``--sweep-every`` seconds and a queue whose ``retention_s`` is ``--retention`` (60 s by
default), one long-polling daemon serving it, and a submitter sending ``--rate`` no-ops a
second (one batch a second) for ``--minutes``. Every ``--sample-every`` seconds it reads
the store directly: the invocation table's row count, its finished rows, and its size on
disk (PostgreSQL: ``pg_total_relation_size`` of the table with its indexes; SQLite: the
pages in use, file pages less free pages, since SQLite reuses freed pages rather than
shrinking the file).

Figures: the samples, and the end against the sample one window after the start (the
first moment the window is full): rows and size should stay flat, not grow with time.

Usage (from the repository root)::

    .venv/bin/python bench/steady_retention.py [--backend sqlite|postgresql|both]
        [--minutes 30] [--rate 50] [--retention 60] [--sweep-every 10]

Every process it starts is stopped before it returns; every wait is bounded.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psycopg
from taskqueue import (
    NOOP,
    NS,
    BenchError,
    check,
    machine,
    pg_database,
    running_server,
    start_daemon,
    stop,
)

QUEUE = "steady"


@contextmanager
def store(backend: str, tmp: Path) -> Iterator[tuple[str, str]]:
    """(what :func:`sample` reads, --db for the server)."""
    if backend == "sqlite":
        path = str(tmp / "store.db")
        yield path, path
    else:
        with pg_database() as url:
            yield url, url


def sample(backend: str, where: str) -> tuple[int, int, int]:
    """(rows, finished rows, bytes in use) of the invocations table."""
    count = (
        "SELECT count(*), count(*) FILTER (WHERE state IN "
        "('succeeded','failed','cancelled','expired')) FROM invocations"
    )
    if backend == "sqlite":
        with sqlite3.connect(where, timeout=30) as conn:
            rows, finished = conn.execute(count).fetchone()
            page_size = conn.execute("PRAGMA page_size").fetchone()[0]
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        conn.close()
        return int(rows), int(finished), int((pages - free) * page_size)
    with psycopg.connect(where, autocommit=True) as conn:
        row = conn.execute(count).fetchone()
        size = conn.execute("SELECT pg_total_relation_size('invocations')").fetchone()
    assert row is not None and size is not None
    return int(row[0]), int(row[1]), int(size[0])


class Submitter:
    """``rate`` no-ops a second, one batch a second, until stopped."""

    def __init__(self, http: httpx.Client, rate: int) -> None:
        self.http, self.rate = http, rate
        self.sent = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        next_at = time.monotonic()
        try:
            while not self._stop.is_set():
                body = {"invocations": [NOOP] * self.rate}
                check(self.http.post(f"{NS}/queues/{QUEUE}/invocations/batch", json=body), 201)
                self.sent += self.rate
                next_at += 1.0
                self._stop.wait(max(0.0, next_at - time.monotonic()))
        except BaseException as exc:  # reported by the main thread
            self.error = exc

    def __enter__(self) -> Submitter:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def run_backend(backend: str, opts: argparse.Namespace) -> None:
    settings = {
        "LAKESHORE_ELASTICITY_ENABLED": "false",
        "LAKESHORE_RETENTION_INTERVAL_S": str(opts.sweep_every),
    }
    with (
        tempfile.TemporaryDirectory(prefix=f"lakeshore-steady-{backend}-") as tmp_name,
        store(backend, Path(tmp_name)) as (where, db),
        running_server(db, Path(tmp_name), **settings) as (url, token),
        httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60
        ) as http,
    ):
        tmp = Path(tmp_name)
        body = {"name": QUEUE, "retention_s": opts.retention}
        check(http.post(f"{NS}/queues", json=body), 201)
        daemon = start_daemon(url, token, tmp / "daemon.log", QUEUE, burst=False)
        samples: list[tuple[float, int, int, int]] = []
        try:
            began = time.monotonic()
            end = began + opts.minutes * 60
            with Submitter(http, opts.rate) as submitter:
                while time.monotonic() < end:
                    if submitter.error is not None:
                        raise BenchError(f"submit failed: {submitter.error}")
                    if daemon.poll() is not None:
                        raise BenchError(f"daemon exited {daemon.returncode}; see {tmp}")
                    rows, finished, size = sample(backend, where)
                    at = time.monotonic() - began
                    samples.append((at, rows, finished, size))
                    print(
                        f"[{backend}] t={at / 60:5.1f} min  sent {submitter.sent:>9,}  "
                        f"rows {rows:>8,} (finished {finished:>8,})  size {size / 2**20:7.1f} MiB",
                        flush=True,
                    )
                    time.sleep(max(0.0, min(opts.sample_every, end - time.monotonic())))
                sent = submitter.sent
        finally:
            stop(daemon)
    full = [s for s in samples if s[0] >= opts.retention + 2 * opts.sweep_every]
    if len(full) < 2:
        raise BenchError("too short a run: no sample after the first full window")
    first, last = full[0], full[-1]
    peak_rows = max(s[1] for s in full)
    peak_size = max(s[3] for s in full)
    print(
        f"[{backend}] {sent:,} submitted over {opts.minutes} min at {opts.rate}/s, "
        f"retention_s {opts.retention}: rows {first[1]:,} at {first[0] / 60:.1f} min -> "
        f"{last[1]:,} at {last[0] / 60:.1f} min ({last[1] / max(first[1], 1):.2f}x, peak "
        f"{peak_rows:,}); size {first[3] / 2**20:.1f} -> {last[3] / 2**20:.1f} MiB "
        f"({last[3] / max(first[3], 1):.2f}x, peak {peak_size / 2**20:.1f} MiB)",
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--rate", type=int, default=50, help="no-ops submitted a second")
    parser.add_argument("--retention", type=int, default=60, help="the queue's retention_s")
    parser.add_argument("--sweep-every", type=int, default=10, help="seconds between sweeps")
    parser.add_argument("--sample-every", type=float, default=60.0)
    opts = parser.parse_args()
    print(machine(), flush=True)
    for backend in ("sqlite", "postgresql") if opts.backend == "both" else (opts.backend,):
        try:
            run_backend(backend, opts)
        except BenchError as exc:
            print(f"[{backend}] failed: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
