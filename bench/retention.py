"""Retention under load: a store holding many finished invocations past their window,
pruned by the server's retention sweep while a drain of no-ops runs, per backend.

For SQLite and/or PostgreSQL it fills a store with ``--history`` finished invocations
(one stream item per ten of them) in a queue whose ``retention_s`` is 60 s, finished two
days ago. Then, in turn on that same store:

1. **without pruning** — a real ``lakeshore server`` with the sweep off
   (``LAKESHORE_RETENTION_INTERVAL_S=0``): ``--drain`` no-ops submitted in batches, then
   drained by ``--daemons`` burst daemons: jobs/s (daemon start to all exited) and the
   submit→start p99 of the drained invocations (``started_at - created_at``, so it
   includes the wait behind the backlog: both runs have the same backlog);
2. **while pruning** — the same server restarted with the sweep every second; the same
   drain on a queue of its own, started as the sweep starts: the same figures, and how
   long the pruning took (first to last deleted row, read from ``/metrics``), and whether
   it overlapped the drain.

Usage (from the repository root)::

    .venv/bin/python bench/retention.py [--backend sqlite|postgresql|both]
        [--history 200000] [--full] [--drain 10000] [--daemons 1]

``--full`` is the issue's size: 1,000,000 finished invocations. Every process it starts is
stopped before it returns; every wait is bounded.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from sqlalchemy import create_engine, insert, pool, select, text
from taskqueue import (
    NS,
    BenchError,
    check,
    machine,
    percentile,
    pg_database,
    running_server,
    start_daemon,
    stop,
    submit_batches,
)

from lakeshore.store.engine import migrate, parse_url
from lakeshore.store.tables import invocations, namespaces, queues, stream_items

FULL = 1_000_000
FILL_CHUNK = 10_000
DRAIN_TIMEOUT_S = 600.0
PRUNE_TIMEOUT_S = 1800.0


def fill(url: str, rows: int) -> None:
    """The default namespace, a queue ``history`` (``retention_s`` 60) with ``rows``
    invocations finished two days ago, and a stream item for every tenth."""
    migrate(parse_url(url))
    engine = create_engine(parse_url(url), poolclass=pool.NullPool)
    now = datetime.now(UTC)
    done = now - timedelta(days=2)
    try:
        with engine.begin() as conn:
            conn.execute(insert(namespaces).values(id="ns_1", name="default", created_at=now))
            conn.execute(
                insert(queues).values(
                    id="q_history",
                    namespace_id="ns_1",
                    name="history",
                    kind="fifo",
                    state="active",
                    created_at=now,
                    updated_at=now,
                    retention_s=60.0,
                )
            )
        for start in range(0, rows, FILL_CHUNK):
            ids = range(start, min(start + FILL_CHUNK, rows))
            with engine.begin() as conn:
                conn.execute(
                    insert(invocations),
                    [
                        {
                            "id": f"inv_h{n:09d}",
                            "namespace_id": "ns_1",
                            "queue_id": "q_history",
                            "queue_name": "history",
                            "fn": "tests.udfs:noop",
                            "args": [],
                            "kwargs": {},
                            "state": ("succeeded", "failed", "cancelled", "expired")[n % 4],
                            "attempts": 1,
                            "available_at": done,
                            "created_at": done,
                            "started_at": done,
                            "finished_at": done,
                        }
                        for n in ids
                    ],
                )
                conn.execute(
                    insert(stream_items),
                    [
                        {"invocation_id": f"inv_h{n:09d}", "seq": 0, "item": n, "created_at": done}
                        for n in ids
                        if n % 10 == 0
                    ],
                )
        with engine.begin() as conn:
            conn.execute(text("ANALYZE"))
    finally:
        engine.dispose()


def waits_ms(url: str, queue: str) -> list[float]:
    """submit → start of each invocation of ``queue``, in ms."""
    engine = create_engine(parse_url(url), poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                select(invocations.c.created_at, invocations.c.started_at).where(
                    invocations.c.queue_name == queue
                )
            ).all()
    finally:
        engine.dispose()
    return [(started - created).total_seconds() * 1000 for created, started in rows]


def deleted_invocations(http: httpx.Client) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith('lakeshore_retention_deleted_total{kind="invocations"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


class PruneWatch:
    """Polls ``/metrics`` in a thread: when the first and the last of ``rows`` went."""

    def __init__(self, http: httpx.Client, rows: int) -> None:
        self.http, self.rows = http, rows
        self.first: float | None = None
        self.last: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        deadline = time.monotonic() + PRUNE_TIMEOUT_S
        while not self._stop.is_set() and time.monotonic() < deadline:
            gone = deleted_invocations(self.http)
            now = time.perf_counter()
            if gone > 0 and self.first is None:
                self.first = now
            if gone >= self.rows:
                self.last = now
                return
            time.sleep(0.1)

    def __enter__(self) -> PruneWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._thread.join(timeout=PRUNE_TIMEOUT_S)
        self._stop.set()


def drain(
    http: httpx.Client, url: str, token: str, workdir: Path, queue: str, opts: argparse.Namespace
) -> tuple[float, float, float]:
    """Submit ``--drain`` no-ops to ``queue`` and drain them: (jobs/s, start, end)."""
    submit_batches(http, queue, opts.drain, 500)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        started = time.perf_counter()
        for n in range(opts.daemons):
            log = workdir / f"{queue}-daemon-{n}.log"
            procs.append(start_daemon(url, token, log, queue, burst=True))
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        for proc in procs:
            code = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            if code != 0:
                raise BenchError(f"daemon exited {code}; see {workdir}")
        ended = time.perf_counter()
    finally:
        for proc in procs:
            stop(proc)
    stats = check(http.get(f"{NS}/queues/{queue}/stats"), 200)
    if stats["byState"].get("succeeded") != opts.drain:
        raise BenchError(f"{queue}: expected {opts.drain} succeeded, got {stats['byState']}")
    return opts.drain / (ended - started), started, ended


@contextmanager
def store(backend: str, tmp: Path) -> Iterator[tuple[str, str]]:
    """(url for SQLAlchemy, --db for the server)."""
    if backend == "sqlite":
        path = tmp / "store.db"
        yield f"sqlite:///{path}", str(path)
    else:
        with pg_database() as url:
            yield url, url


def run_backend(backend: str, opts: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix=f"lakeshore-retention-{backend}-") as tmp_name:
        tmp = Path(tmp_name)
        with store(backend, tmp) as (url, db):
            began = time.perf_counter()
            fill(url, opts.history)
            print(
                f"[{backend}] filled {opts.history:,} finished invocations in "
                f"{time.perf_counter() - began:.1f} s",
                flush=True,
            )
            quiet = {"LAKESHORE_ELASTICITY_ENABLED": "false"}
            with (
                running_server(db, tmp, LAKESHORE_RETENTION_INTERVAL_S="0", **quiet) as (
                    server_url,
                    token,
                ),
                httpx.Client(
                    base_url=server_url, headers={"Authorization": f"Bearer {token}"}, timeout=60
                ) as http,
            ):
                rate_a, _, _ = drain(http, server_url, token, tmp, "drain-a", opts)
            p99_a = percentile(waits_ms(url, "drain-a"), 99)
            print(
                f"[{backend}] without pruning: {rate_a:,.0f} jobs/s, "
                f"submit→start p99 {p99_a:,.0f} ms",
                flush=True,
            )
            with (
                running_server(db, tmp, LAKESHORE_RETENTION_INTERVAL_S="1", **quiet) as (
                    server_url,
                    token,
                ),
                httpx.Client(
                    base_url=server_url, headers={"Authorization": f"Bearer {token}"}, timeout=60
                ) as http,
                PruneWatch(http, opts.history) as watch,
            ):
                rate_b, start_b, end_b = drain(http, server_url, token, tmp, "drain-b", opts)
                watch.__exit__()
            p99_b = percentile(waits_ms(url, "drain-b"), 99)
            if watch.first is None or watch.last is None:
                raise BenchError(f"[{backend}] the pruning did not finish")
            overlap = max(0.0, min(end_b, watch.last) - max(start_b, watch.first))
            print(
                f"[{backend}] while pruning: {rate_b:,.0f} jobs/s "
                f"({rate_b / rate_a:.2f}x without), submit→start p99 {p99_b:,.0f} ms "
                f"({p99_b / p99_a:.2f}x without); pruned {opts.history:,} in "
                f"{watch.last - watch.first:.1f} s "
                f"({opts.history / max(watch.last - watch.first, 1e-9):,.0f} rows/s), "
                f"overlapping the drain for {overlap:.1f} of its {end_b - start_b:.1f} s",
                flush=True,
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--history", type=int, default=200_000)
    parser.add_argument("--full", action="store_true", help=f"--history {FULL:,}")
    parser.add_argument("--drain", type=int, default=10_000)
    parser.add_argument("--daemons", type=int, default=1)
    opts = parser.parse_args()
    if opts.full:
        opts.history = FULL
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
