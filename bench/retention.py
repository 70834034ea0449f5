"""Retention under load: a store holding many finished invocations past their window,
pruned by the server's retention sweep while a drain of no-ops runs, per backend.

For SQLite and/or PostgreSQL it fills a store with ``--history`` finished invocations
(one stream item per ten of them) in a queue whose ``retention_s`` is 60 s, finished two
days ago. Then, in turn on that same store, a real ``lakeshore server``:

0. **no history**: ``--drain`` no-ops, submitted in batches, drained by ``--daemons``
   burst daemons, on an empty store, with the probe below running as in the other runs;
   then ``stats`` read on its queue;
1. **without pruning** (the history within the server's window, so the sweep, every
   second, only tallies it): ``stats`` of the history's queue once tallied, then the
   same drain while a probe submits one no-op every 0.1 s to a queue of its own, served
   by an idle long-polling daemon;
2. **while pruning**: the same server restarted with the sweep every second, the same
   drain and probe on queues of their own; once a tenth of the drain is done (the
   daemons at full speed), the history's queue is given ``retention_s: 60``, so the next
   sweep prunes it while they drain.

Figures: ``stats``' p50 on the history's queue against the drained queue's with no
history, and the drain's jobs/s with the history kept against with none (both should be
flat as history grows); the drain's jobs/s — over the whole drain, and over the part of
it the pruning overlapped (its invocations started while the pruning ran, first to
last) — and the probe's submit→start p99 (from just before its submit was sent to its
``started_at``; the drain's own waits are its backlog, the same in both runs), with and
without pruning; and how long the pruning took (first to last deleted row, read from
``/metrics``).

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
from typing import ClassVar

import httpx
from sqlalchemy import create_engine, insert, pool, select, text
from taskqueue import (
    NOOP,
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
PROBE_EVERY_S = 0.1


def fill(url: str, rows: int) -> None:
    """The default namespace, a queue ``history`` with ``rows`` invocations finished two
    days ago (within the server's default window of a week: a run sets the queue's
    ``retention_s`` when it means them pruned), and a stream item for every tenth."""
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


def times(url: str, queue: str) -> list[tuple[datetime, datetime]]:
    """(created, started) of each started invocation of ``queue``."""
    engine = create_engine(parse_url(url), poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                select(invocations.c.created_at, invocations.c.started_at)
                .where(invocations.c.queue_name == queue)
                .order_by(invocations.c.created_at)
            ).all()
    finally:
        engine.dispose()
    return [(created, started) for created, started in rows if started is not None]


def wait_ms(pair: tuple[datetime, datetime]) -> float:
    return (pair[1] - pair[0]).total_seconds() * 1000


def probe_waits(url: str, queue: str) -> list[tuple[datetime, datetime]]:
    """(sent, started) of each probe: from just before its submit was sent (the client's
    clock) to its start as the server stamped it (the same machine's clock), so the
    submit's round trip is included."""
    engine = create_engine(parse_url(url), poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                select(invocations.c.id, invocations.c.started_at).where(
                    invocations.c.queue_name == queue
                )
            ).all()
    finally:
        engine.dispose()
    pairs = [(Probe.sent[i], started) for i, started in rows if i in Probe.sent and started]
    return sorted(pairs)


def deleted_invocations(http: httpx.Client) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith('lakeshore_retention_deleted_total{kind="invocations"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


class PruneWatch:
    """Polls ``/metrics`` in a thread: when the first and the last of ``rows`` went."""

    def __init__(self, http: httpx.Client, rows: int) -> None:
        self.http, self.rows = http, rows
        self.first: datetime | None = None
        self.last: datetime | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        deadline = time.monotonic() + PRUNE_TIMEOUT_S
        while not self._stop.is_set() and time.monotonic() < deadline:
            gone = deleted_invocations(self.http)
            now = datetime.now(UTC)
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


class Probe:
    """One no-op every ``PROBE_EVERY_S`` to ``queue`` (served by an idle daemon), in a
    thread, for as long as the block runs."""

    sent: ClassVar[dict[str, datetime]] = {}  # invocation id → when its submit was sent

    def __init__(self, http: httpx.Client, queue: str) -> None:
        self.http, self.queue = http, queue
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(PROBE_EVERY_S):
            sent = datetime.now(UTC)
            made = check(self.http.post(f"{NS}/queues/{self.queue}/invocations", json=NOOP), 201)
            Probe.sent[made["id"]] = sent

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


@contextmanager
def probing(http: httpx.Client, url: str, token: str, workdir: Path, queue: str) -> Iterator[None]:
    """An idle daemon long-polling ``queue``, and the probe submitting to it."""
    check(http.post(f"{NS}/queues/{queue}/invocations", json=NOOP), 201)  # makes the queue
    daemon = start_daemon(url, token, workdir / f"{queue}-daemon.log", queue, burst=False)
    try:
        deadline = time.monotonic() + 60
        while check(http.get(f"{NS}/queues/{queue}/stats"), 200)["byState"].get("succeeded", 0) < 1:
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"the probe's daemon did not start; see {workdir}")
            time.sleep(0.05)
        with Probe(http, queue):
            yield
    finally:
        stop(daemon)


def drain(
    http: httpx.Client,
    url: str,
    token: str,
    workdir: Path,
    queue: str,
    opts: argparse.Namespace,
    *,
    prune: bool = False,
) -> tuple[float, float, float]:
    """Submit ``--drain`` no-ops to ``queue`` and drain them: (jobs/s, start, end).
    ``prune``: the history is put past its window (``retention_s`` 60) once a tenth is
    drained, so the next sweep (within a second) prunes while they drain."""
    submit_batches(http, queue, opts.drain, 500)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        started = time.perf_counter()
        for n in range(opts.daemons):
            log = workdir / f"{queue}-daemon-{n}.log"
            procs.append(start_daemon(url, token, log, queue, burst=True))
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while prune and _succeeded(http, queue) < opts.drain // 10:  # at full speed first
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise BenchError(f"the drain of {queue} stopped early; see {workdir}")
            time.sleep(0.1)
        if prune:
            check(http.patch(f"{NS}/queues/history", json={"retention_s": 60}), 200)
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


def _succeeded(http: httpx.Client, queue: str) -> int:
    by_state = check(http.get(f"{NS}/queues/{queue}/stats"), 200)["byState"]
    return int(by_state.get("succeeded", 0))


@contextmanager
def store(backend: str, tmp: Path) -> Iterator[tuple[str, str]]:
    """(url for SQLAlchemy, --db for the server)."""
    if backend == "sqlite":
        path = tmp / "store.db"
        yield f"sqlite:///{path}", str(path)
    else:
        with pg_database() as url:
            yield url, url


STATS_READS = 20


def stats_ms(http: httpx.Client, queue: str) -> float:
    """p50 of ``STATS_READS`` reads of the queue's ``stats`` (client round trip, ms)."""
    took = []
    for _ in range(STATS_READS):
        began = time.perf_counter()
        check(http.get(f"{NS}/queues/{queue}/stats"), 200)
        took.append((time.perf_counter() - began) * 1000)
    return percentile(took, 50)


def tallied(http: httpx.Client, queue: str, rows: int) -> None:
    """Wait (bounded) until a sweep has tallied the queue's ``rows`` finished ones: the
    tally is what ``stats`` reads once the leader made it."""
    deadline = time.monotonic() + 120
    while stats_ms(http, queue) > 50 and time.monotonic() < deadline:
        time.sleep(1)
    by_state = check(http.get(f"{NS}/queues/{queue}/stats"), 200)["byState"]
    got = sum(by_state.get(s, 0) for s in ("succeeded", "failed", "cancelled", "expired"))
    if got != rows:
        raise BenchError(f"{queue}: stats count {got:,} finished, expected {rows:,}")


def run_backend(backend: str, opts: argparse.Namespace) -> None:
    quiet = {"LAKESHORE_ELASTICITY_ENABLED": "false"}
    with tempfile.TemporaryDirectory(prefix=f"lakeshore-retention-{backend}-") as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "empty").mkdir()
        with (
            store(backend, tmp / "empty") as (_, db),
            running_server(db, tmp / "empty", LAKESHORE_RETENTION_INTERVAL_S="1", **quiet) as (
                su,
                tok,
            ),
            _client(su, tok) as http,
        ):
            with probing(http, su, tok, tmp / "empty", "probe-0"):  # as in the other runs
                rate_0, _, _ = drain(http, su, tok, tmp, "drain-0", opts)
            stats_0 = stats_ms(http, "drain-0")
        print(
            f"[{backend}] no history: {rate_0:,.0f} jobs/s; stats of the drained queue "
            f"({opts.drain:,} finished) p50 {stats_0:.1f} ms",
            flush=True,
        )
        with store(backend, tmp) as (url, db):
            began = time.perf_counter()
            fill(url, opts.history)
            took = time.perf_counter() - began
            print(f"[{backend}] filled {opts.history:,} finished invocations in {took:.1f} s")
            # the sweep runs (it tallies) but deletes nothing: the history is within the
            # server's window until the second run gives its queue retention_s 60
            with (
                running_server(db, tmp, LAKESHORE_RETENTION_INTERVAL_S="1", **quiet) as (su, tok),
                _client(su, tok) as http,
            ):
                tallied(http, "history", opts.history)
                stats_h = stats_ms(http, "history")
                with probing(http, su, tok, tmp, "probe-a"):
                    rate_a, _, _ = drain(http, su, tok, tmp, "drain-a", opts)
            print(
                f"[{backend}] {opts.history:,} finished kept: stats of their queue p50 "
                f"{stats_h:.1f} ms ({stats_h / stats_0:.2f}x the drained queue's with no "
                f"history); drain {rate_a:,.0f} jobs/s ({rate_a / rate_0:.2f}x with no history)",
                flush=True,
            )
            probes_a = [wait_ms(p) for p in probe_waits(url, "probe-a")]
            p99_a = percentile(probes_a, 99)
            print(
                f"[{backend}] without pruning: {rate_a:,.0f} jobs/s, "
                f"probe submit→start p99 {p99_a:,.1f} ms ({_spread(probes_a)})",
                flush=True,
            )
            with (
                running_server(db, tmp, LAKESHORE_RETENTION_INTERVAL_S="1", **quiet) as (su, tok),
                _client(su, tok) as http,
                PruneWatch(http, opts.history) as watch,
                probing(http, su, tok, tmp, "probe-b"),
            ):
                rate_b, _, _ = drain(http, su, tok, tmp, "drain-b", opts, prune=True)
                watch.__exit__()
            first, last = watch.first, watch.last
            if first is None or last is None:
                raise BenchError(f"[{backend}] the pruning did not finish")
            span = (last - first).total_seconds()
            # the drain's starts while the pruning ran: its rate over that overlap (the
            # pruning of a large history outlasts a short drain)
            during = sorted(p[1] for p in times(url, "drain-b") if first <= p[1] <= last)
            probes = [wait_ms(p) for p in probe_waits(url, "probe-b") if first <= p[0] <= last]
            overlap = (during[-1] - during[0]).total_seconds() if len(during) > 1 else 0.0
            rate_during = len(during) / overlap if overlap > 0 else float("nan")
            p99_b = percentile(probes, 99) if probes else float("nan")
            p99_a = p99_a or float("nan")
            print(
                f"[{backend}] while pruning: {rate_b:,.0f} jobs/s over the drain "
                f"({rate_b / rate_a:.2f}x), {rate_during:,.0f} jobs/s while the pruning ran "
                f"({rate_during / rate_a:.2f}x); probe submit→start p99 {p99_b:,.1f} ms "
                f"({p99_b / p99_a:.2f}x, {len(probes)} probes: {_spread(probes)}); "
                f"pruned {opts.history:,} "
                f"in {span:.1f} s ({opts.history / max(span, 1e-9):,.0f} rows/s)",
                flush=True,
            )


def _spread(values: list[float]) -> str:
    if not values:
        return "none"
    return f"p50 {percentile(values, 50):,.1f}, p95 {percentile(values, 95):,.1f} ms"


def _client(url: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60)


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
