"""Controller benchmark: the elasticity tick over 100, 1,000 and 10,000 active queues.

For each backend (a SQLite file in a temp dir, a fresh PostgreSQL database) and each size
N, the state is written straight into a fresh store with batched inserts (executemany):
one namespace; N active queues, ``fully_elastic`` with ``min 5 max 5``; 5 idle workers
subscribed to each queue; ``--pending`` pending invocations per queue (<= 5, so the
decision stays a no-op ``steady``) and one running invocation on each queue's first
worker (so the running-lease counts have rows to count). Then ``Controller.tick()`` runs
``1 + --repeat`` times in-process (the first is a warm-up) and we report, per N:

* the median tick wall time and that time per queue;
* the SQL statements one tick sends, counted with a ``before_cursor_execute`` listener
  on ``store.engine.sync_engine`` (an ``executemany`` counts once; on SQLite the
  explicit ``BEGIN`` / ``BEGIN IMMEDIATE`` of each transaction counts too; ``COMMIT``
  and PostgreSQL's pool pre-ping do not go through a cursor and are not counted);
* the connections a tick checks out of the pool (one per transaction);
* the longest the event loop went unanswered during a tick ("loop stall"): the server
  runs the tick on the loop that also serves the API.

The statement count must not depend on N (no per-queue round trips); the script says so.

A second scenario (skip with ``--no-launch``) registers a ``fake`` provider, points
every queue at it (``providerRef``, ``max 6``) and tops each queue up to 6 pending, so
every queue launches one daemon on every tick (between ticks, outside the timing, the
previous tick's launches are marked ``succeeded`` as if their daemons had said hello, so
nothing stays in flight). Each launch costs statements of its own (its worker token and
launch row, then the provider's handle) and a provider call: that is expected and is not
a per-queue read. Then one "expiry" tick: every queue is set back to ``max 5`` (nothing
to launch), the clock moves past the fake provider's 15 s TTL, and the tick expires the
last tick's N launches, which never said hello, and asks the provider to stop each one.
By default this runs for N = 100 and 1,000 only (``--launch-sizes``): at 10,000 one
launch tick takes over a minute here, so that size gets one tick and no warm-up.

Usage (from the repository root)::

    .venv/bin/python bench/controller.py [--backend sqlite|postgresql|both]
        [--sizes 100,1000,10000] [--repeat 5] [--repeat-large 3]
        [--no-launch | --launch-sizes 100,1000] [--launch-repeat 2]

A fake clock drives the controller (5 s per tick; 16 s before the expiry tick); wall time
is measured with ``time.perf_counter``. Every database it creates is dropped. The exit
status is 1 when the steady statement count is not the same for every N.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import os
import platform
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import event, func, insert, select, update
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection

from lakeshore import runtime
from lakeshore.domain.ids import new_id
from lakeshore.domain.queue import parse_spec
from lakeshore.services.fleet.controller import Controller
from lakeshore.store.engine import Store, create_engine_for, parse_url, prepare
from lakeshore.store.rows import queue_columns
from lakeshore.store.tables import (
    elasticity_events,
    invocations,
    launches,
    namespaces,
    providers,
    queues,
    worker_queues,
    workers,
)

PG_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"
WORKERS_PER_QUEUE = 5
CHUNK = 10_000  # rows per executemany
STEADY = {"kind": "fully_elastic", "min": 5, "max": 5}
LAUNCHING = {"kind": "fully_elastic", "min": 5, "max": 6}
LAUNCH_PENDING = 6
TICK_STEP = timedelta(seconds=5)
EXPIRY_STEP = timedelta(seconds=16)  # past the fake provider's 15 s launch TTL


class BenchError(Exception):
    pass


class Clock:
    """The controller's clock: moves only when told to."""

    def __init__(self) -> None:
        self.now = datetime(2030, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, step: timedelta) -> None:
        self.now += step


@dataclass
class Counter:
    """SQL statements sent through the engine (one per cursor execute / executemany), and
    connections checked out of the pool (one per ``store.read()`` / ``store.write()``)."""

    statements: int = 0
    checkouts: int = 0
    texts: list[str] = field(default_factory=list)

    def on_execute(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        self.statements += 1
        self.texts.append(" ".join(statement.split())[:60])

    def on_checkout(self, *args: Any) -> None:
        self.checkouts += 1

    def attach(self, store: Store, on: bool = True) -> None:
        do = event.listen if on else event.remove
        do(store.engine.sync_engine, "before_cursor_execute", self.on_execute)
        do(store.engine.sync_engine.pool, "checkout", self.on_checkout)

    def show(self, label: str) -> None:
        """The last tick's statements, tallied (for --verbose)."""
        print(f"    {label} tick, {self.statements} statements:", flush=True)
        for text, times in collections.Counter(self.texts).items():
            print(f"      {times:>6} x {text}", flush=True)

    def reset(self) -> None:
        self.statements = 0
        self.checkouts = 0
        self.texts.clear()


@dataclass
class Ticks:
    times: list[float]  # seconds, measured ticks only
    statements: list[int]  # per measured tick
    checkouts: list[int]  # per measured tick
    stalls: list[float]  # seconds: the longest the event loop went unanswered, per tick
    warmup_s: float | None  # None: no warm-up tick
    warmup_statements: int

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times) * 1000

    @property
    def stall_ms(self) -> float:
        return statistics.median(self.stalls) * 1000

    @property
    def statements_label(self) -> str:
        return "/".join(str(n) for n in sorted(set(self.statements)))

    @property
    def checkouts_label(self) -> str:
        return "/".join(str(n) for n in sorted(set(self.checkouts)))

    def warmup_label(self) -> str:
        if self.warmup_s is None:
            return "no warm-up"
        return f"warm-up {self.warmup_s * 1000:,.0f} ms ({self.warmup_statements} statements)"


@dataclass
class Result:
    backend: str
    n: int
    build_s: float
    steady: Ticks
    rows_per_queue: float = 0.0  # audit rows per queue after the steady ticks (folding)
    launch: Ticks | None = None
    expiry: Ticks | None = None


# --- stores --------------------------------------------------------------------------------


@contextmanager
def pg_database(server: str) -> Iterator[str]:
    name = f"lakeshore_bench_{secrets.token_hex(4)}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(server).set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def database(backend: str, opts: argparse.Namespace) -> Iterator[str]:
    if backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix="lakeshore-bench-controller-") as tmp:
            yield f"sqlite:///{Path(tmp) / 'bench.db'}"
    else:
        with pg_database(opts.pg) as url:
            yield url


# --- building the state --------------------------------------------------------------------


async def insert_chunked(store: Store, table: Any, rows: list[dict[str, Any]]) -> None:
    async with store.write() as conn:
        for start in range(0, len(rows), CHUNK):
            await conn.execute(insert(table), rows[start : start + CHUNK])


def invocation_row(
    ns_id: str, queue_id: str, queue_name: str, now: datetime, **extra: Any
) -> dict[str, Any]:
    return {
        "id": new_id("inv"),
        "namespace_id": ns_id,
        "queue_id": queue_id,
        "queue_name": queue_name,
        "fn": "tests.udfs:noop",
        "args": [],
        "kwargs": {},
        "state": "pending",
        "available_at": now,
        "created_at": now,
        **extra,
    }


async def build(
    store: Store, n: int, pending: int, now: datetime
) -> tuple[str, list[tuple[str, str]]]:
    """One namespace, n steady queues with 5 idle workers each; (ns id, [(queue id, name)])."""
    ns_id = new_id("ns")
    async with store.write() as conn:
        await conn.execute(insert(namespaces).values(id=ns_id, name="bench", created_at=now))
    template = queue_columns(parse_spec({"name": "q0", "elasticity": STEADY}))
    queue_rows, worker_rows, member_rows, inv_rows = [], [], [], []
    ids: list[tuple[str, str]] = []
    for i in range(n):
        queue_id, name = new_id("q"), f"q{i:05d}"
        ids.append((queue_id, name))
        created = now + timedelta(microseconds=i)
        queue_rows.append(
            {
                **template,
                "name": name,
                "id": queue_id,
                "namespace_id": ns_id,
                "state": "active",
                "created_at": created,
                "updated_at": created,
            }
        )
        first_worker = ""
        for _ in range(WORKERS_PER_QUEUE):
            worker_id = new_id("wrk")
            first_worker = first_worker or worker_id
            worker_rows.append(
                {
                    "id": worker_id,
                    "name": worker_id,
                    "namespace_id": ns_id,
                    "runners": ["process"],
                    "tags": [],
                    "capabilities": {},
                    "max_invocations": 4,
                    "current_invocations": None,
                    "cost_weight": None,
                    "retiring": False,
                    "last_seen_at": now,
                    "created_at": now,
                }
            )
            member_rows.append({"worker_id": worker_id, "queue_id": queue_id})
        for _ in range(pending):
            inv_rows.append(invocation_row(ns_id, queue_id, name, now))
        inv_rows.append(
            invocation_row(
                ns_id,
                queue_id,
                name,
                now,
                state="running",
                worker_id=first_worker,
                attempts=1,
                started_at=now,
                lease_expires_at=now + timedelta(days=1),
            )
        )
    await insert_chunked(store, queues, queue_rows)
    await insert_chunked(store, workers, worker_rows)
    await insert_chunked(store, worker_queues, member_rows)
    await insert_chunked(store, invocations, inv_rows)
    return ns_id, ids


async def make_launching(
    store: Store, ns_id: str, ids: list[tuple[str, str]], pending: int, now: datetime
) -> None:
    """A fake provider; every queue names it, may grow to 6 and has 6 pending."""
    columns = queue_columns(parse_spec({"name": "q0", "elasticity": LAUNCHING}))
    async with store.write() as conn:
        await conn.execute(
            insert(providers).values(
                id=new_id("prv"),
                namespace_id=ns_id,
                name="fake",
                kind="fake",
                config={},
                created_at=now,
                updated_at=now,
            )
        )
        await conn.execute(
            update(queues)
            .where(queues.c.namespace_id == ns_id)
            .values(
                provider_ref="fake",
                elasticity=columns["elasticity"],
                updated_at=now,
                revision=queues.c.revision + 1,  # as every write of a queue row does
            )
        )
    extra = LAUNCH_PENDING - pending
    rows = [invocation_row(ns_id, qid, name, now) for qid, name in ids for _ in range(extra)]
    await insert_chunked(store, invocations, rows)


async def set_launches(conn: AsyncConnection, state: str, now: datetime) -> None:
    await conn.execute(
        update(launches).where(launches.c.state == "in_flight").values(state=state, resolved_at=now)
    )


async def make_steady(store: Store, ns_id: str, now: datetime) -> None:
    """Every queue back to ``max 5``: with 5 daemons and 6 pending, nothing to launch."""
    columns = queue_columns(parse_spec({"name": "q0", "elasticity": STEADY}))
    async with store.write() as conn:
        await conn.execute(
            update(queues)
            .where(queues.c.namespace_id == ns_id)
            .values(
                elasticity=columns["elasticity"], updated_at=now, revision=queues.c.revision + 1
            )
        )


# --- ticking -------------------------------------------------------------------------------

WATCH_S = 0.005


async def watch_loop(longest: list[float]) -> None:
    """Keep ``longest[0]`` at the longest the event loop kept a 5 ms sleeper waiting extra.

    The server runs the tick on the event loop that serves the API, so this is how long a
    request (a claim, a heartbeat) could wait behind the tick.
    """
    loop = asyncio.get_running_loop()
    while True:
        started = loop.time()
        await asyncio.sleep(WATCH_S)
        longest[0] = max(longest[0], loop.time() - started - WATCH_S)


async def run_ticks(
    controller: Controller,
    clock: Clock,
    counter: Counter,
    *,
    n: int,
    repeat: int,
    step: timedelta,
    action: str,
    warmup: bool = True,
    before: Callable[[], Awaitable[None]] | None = None,
) -> Ticks:
    """``1 + repeat`` ticks (the first a warm-up unless ``warmup`` is false); ``before``
    runs ahead of every tick but the first, outside the timing and the counts."""
    times: list[float] = []
    statements: list[int] = []
    checkouts: list[int] = []
    stalls: list[float] = []
    warmup_s: float | None = None
    warmup_statements = 0
    for i in range(1 - int(warmup), 1 + repeat):
        if before is not None and i > 1 - int(warmup):
            await before()
        counter.reset()
        longest = [0.0]
        watcher = asyncio.create_task(watch_loop(longest))
        await asyncio.sleep(0)  # let the watcher start its first sleep
        started = time.perf_counter()
        try:
            decisions = await controller.tick()
        finally:
            elapsed = time.perf_counter() - started
            watcher.cancel()
        if len(decisions) != n:
            raise BenchError(f"expected {n} decisions, got {len(decisions)}")
        wrong = [d for d in decisions if d["action"] != action]
        if wrong:
            raise BenchError(f"{len(wrong)} decisions are not {action}; first: {wrong[0]}")
        if i == 0:
            warmup_s, warmup_statements = elapsed, counter.statements
        else:
            times.append(elapsed)
            statements.append(counter.statements)
            checkouts.append(counter.checkouts)
            stalls.append(longest[0])
        clock.advance(step)
    return Ticks(times, statements, checkouts, stalls, warmup_s, warmup_statements)


async def measure(backend: str, url_text: str, n: int, opts: argparse.Namespace) -> Result:
    url = parse_url(url_text)
    await asyncio.to_thread(prepare, url)
    store = Store(create_engine_for(url))
    try:
        clock = Clock()
        started = time.perf_counter()
        ns_id, ids = await build(store, n, opts.pending, clock())
        build_s = time.perf_counter() - started
        counter = Counter()
        counter.attach(store)
        large = n >= 10_000
        repeat = opts.repeat_large if large else opts.repeat
        controller = Controller(store, clock=clock, server_url="http://127.0.0.1:1")
        steady = await run_ticks(
            controller, clock, counter, n=n, repeat=repeat, step=TICK_STEP, action="tick_noop"
        )
        if opts.verbose:
            counter.show("steady")
        async with store.read() as conn:
            rows = (
                await conn.execute(select(func.count()).select_from(elasticity_events))
            ).scalar()
        result = Result(backend, n, build_s, steady, rows_per_queue=(rows or 0) / n)
        if opts.launch and n in opts.launch_sizes:
            await make_launching(store, ns_id, ids, opts.pending, clock())

            async def hello_all() -> None:
                """The last tick's daemons said hello (and left): nothing stays in flight."""
                async with store.write() as conn:
                    await set_launches(conn, "succeeded", clock())

            controller = Controller(store, clock=clock, server_url="http://127.0.0.1:1")
            result.launch = await run_ticks(
                controller,
                clock,
                counter,
                n=n,
                repeat=opts.launch_repeat_large if large else opts.launch_repeat,
                step=TICK_STEP,
                action="scale_up",
                warmup=not large,
                before=hello_all,
            )
            if opts.verbose:
                counter.show("launch")
            # The last tick's N launches never say hello: past their TTL, the next tick
            # expires them and asks the provider to stop each one. No new launches.
            await make_steady(store, ns_id, clock())
            clock.advance(EXPIRY_STEP)
            result.expiry = await run_ticks(
                controller,
                clock,
                counter,
                n=n,
                repeat=1,
                step=TICK_STEP,
                action="tick_noop",
                warmup=False,
            )
            if opts.verbose:
                counter.show("expiry")
        return result
    finally:
        await store.close()


# --- report --------------------------------------------------------------------------------


def machine() -> str:
    model = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return (
        f"nproc: {os.cpu_count()} (affinity {len(os.sched_getaffinity(0))})\n"
        f"cpu: {model}\n"
        f"python: {platform.python_version()} ({sys.executable})"
    )


def pg_version(server: str) -> str:
    with psycopg.connect(server) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return str(row[0]) if row else "unknown"


def report(results: list[Result]) -> bool:
    """Print the tables; True when statements per steady tick are the same for every N."""
    print()
    print("steady ticks (every decision a no-op):")
    print(
        "| backend    |      N | ticks | median tick (ms) | ms / queue "
        "| statements / tick | connections / tick | loop stall (ms) | event rows / queue |"
    )
    print(
        "|------------|-------:|------:|-----------------:|-----------:"
        "|------------------:|-------------------:|----------------:|-------------------:|"
    )
    for r in results:
        s = r.steady
        print(
            f"| {r.backend:<10} | {r.n:>6,} | {len(s.times):>5} | {s.median_ms:>16,.1f} "
            f"| {s.median_ms / r.n:>10.3f} | {s.statements_label:>17} "
            f"| {s.checkouts_label:>18} | {s.stall_ms:>15,.0f} | {r.rows_per_queue:>18.2f} |"
        )
    print(
        "'event rows / queue': audit rows in the store after the warm-up and the measured "
        "ticks,\nper queue (identical consecutive no-ops of a queue fold into one row)."
    )
    launched = [r for r in results if r.launch is not None]
    if launched:
        print()
        print("launch ticks (every queue launches one daemon through the fake provider):")
        print(
            "| backend    |      N | ticks | median tick (ms) | ms / queue "
            "| statements / tick | per launch | connections / tick | loop stall (ms) |"
        )
        print(
            "|------------|-------:|------:|-----------------:|-----------:"
            "|------------------:|-----------:|-------------------:|----------------:|"
        )
        for r in launched:
            lt = r.launch
            assert lt is not None
            per_launch = (statistics.median(lt.statements) - r.steady.statements[0]) / r.n
            print(
                f"| {r.backend:<10} | {r.n:>6,} | {len(lt.times):>5} | {lt.median_ms:>16,.1f} "
                f"| {lt.median_ms / r.n:>10.3f} | {lt.statements_label:>17} "
                f"| {per_launch:>10.2f} | {lt.checkouts_label:>18} | {lt.stall_ms:>15,.0f} |"
            )
        print(
            "'loop stall' is the longest the event loop (which also serves the API) went "
            "unanswered during a tick.\n"
            "A tick records its launches (worker tokens and launch rows) in one transaction, "
            "then each\nlaunch calls its provider, and the handles answered are "
            "group-committed (those that\narrive while one write runs go in the next); "
            "an executemany UPDATE counts once per row on\nSQLite. 'per launch' is "
            "(launch tick - steady tick) / N."
        )
    expired = [r for r in results if r.expiry is not None]
    if expired:
        print()
        print("expiry tick (the N launches of the last launch tick pass their TTL unanswered):")
        print(
            "| backend    |      N | tick (ms) | ms / expired launch | statements "
            "| per expired launch | connections | loop stall (ms) |"
        )
        print(
            "|------------|-------:|----------:|--------------------:|-----------:"
            "|-------------------:|------------:|----------------:|"
        )
        for r in expired:
            ex = r.expiry
            assert ex is not None
            per = (ex.statements[0] - r.steady.statements[0]) / r.n
            print(
                f"| {r.backend:<10} | {r.n:>6,} | {ex.median_ms:>9,.1f} "
                f"| {ex.median_ms / r.n:>19.3f} | {ex.statements_label:>10} | {per:>18.2f} "
                f"| {ex.checkouts_label:>11} | {ex.stall_ms:>15,.0f} |"
            )
    print()
    constant = True
    for backend in sorted({r.backend for r in results}, key=["sqlite", "postgresql"].index):
        rows = [r for r in results if r.backend == backend]
        counts = {c for r in rows for c in r.steady.statements}
        sizes = ", ".join(f"{r.n:,}" for r in rows)
        if len(counts) == 1:
            print(
                f"{backend}: statements per steady tick CONSTANT at {counts.pop()} for N = {sizes}"
            )
        else:
            constant = False
            detail = "; ".join(f"N={r.n:,}: {r.steady.statements_label}" for r in rows)
            print(f"{backend}: statements per steady tick NOT CONSTANT: {detail}")
    return constant


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("sqlite", "postgresql", "both"), default="both")
    parser.add_argument(
        "--sizes", default="100,1000,10000", help="comma-separated queue counts (default all)"
    )
    parser.add_argument("--repeat", type=int, default=5, help="measured ticks after a warm-up")
    parser.add_argument(
        "--repeat-large", type=int, default=3, help="measured ticks for N >= 10,000"
    )
    parser.add_argument(
        "--launch-repeat", type=int, default=2, help="measured launch ticks after a warm-up"
    )
    parser.add_argument(
        "--launch-repeat-large",
        type=int,
        default=1,
        help="launch ticks for N >= 10,000 (no warm-up: one takes ~50 s)",
    )
    parser.add_argument("--no-launch", dest="launch", action="store_false", help="steady only")
    parser.add_argument(
        "--launch-sizes",
        default="100,1000",
        help="sizes that also run the launch scenario (10,000 takes ~1-1.5 min per tick)",
    )
    parser.add_argument("--pending", type=int, default=3, help="pending per queue (<= 5)")
    parser.add_argument("--pg", default=PG_SERVER, help="PostgreSQL server to create DBs on")
    parser.add_argument("--verbose", action="store_true", help="print each tick's statements")
    parser.add_argument(
        "--default-gc",
        action="store_true",
        help="keep CPython's GC thresholds (the server tunes them: lakeshore.runtime)",
    )
    opts = parser.parse_args()
    if not 0 <= opts.pending <= 5:
        parser.error("--pending must be 0..5 (more would make the steady decision scale up)")
    sizes = [int(s.replace("_", "")) for s in opts.sizes.split(",") if s.strip()]
    opts.launch_sizes = {int(s.replace("_", "")) for s in opts.launch_sizes.split(",") if s}
    backends = ["sqlite", "postgresql"] if opts.backend == "both" else [opts.backend]

    if not opts.default_gc:
        runtime.tune()  # as `lakeshore server` does
    print(machine(), flush=True)
    print(f"gc thresholds: {gc.get_threshold()}", flush=True)
    if "postgresql" in backends:
        print(f"postgresql: {pg_version(opts.pg)}", flush=True)
    results: list[Result] = []
    started = time.perf_counter()
    for backend in backends:
        for n in sizes:
            print(f"[{backend} N={n:,}]", flush=True)
            with database(backend, opts) as url:
                r = asyncio.run(measure(backend, url, n, opts))
            results.append(r)
            print(
                f"  built in {r.build_s:.1f} s; steady: {r.steady.warmup_label()}, median "
                f"{r.steady.median_ms:,.1f} ms, {r.steady.statements_label} statements",
                flush=True,
            )
            if r.launch is not None:
                print(
                    f"  launch: {r.launch.warmup_label()}, median "
                    f"{r.launch.median_ms:,.1f} ms, {r.launch.statements_label} statements",
                    flush=True,
                )
            if r.expiry is not None:
                print(
                    f"  expiry: {r.expiry.median_ms:,.1f} ms, "
                    f"{r.expiry.statements_label} statements",
                    flush=True,
                )
    constant = report(results)
    print(f"total {time.perf_counter() - started:.0f} s")
    return 0 if constant else 1


if __name__ == "__main__":
    sys.exit(main())
