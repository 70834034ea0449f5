"""Lakeshore against PgQueuer and Procrastinate: the same work, in one run, on one machine.

First the enqueues, every system up at once on a fresh store of its own, the systems
taking turns (see ``enqueue_in_turn``: each one's calls cut into ten turns, in a rotating
order, so that a busy moment of the machine falls on all alike):

1. enqueue in batches: ``--batches`` x ``--batch-size`` jobs, after one warm-up batch;
2. enqueue one call per job: ``--single`` sequential calls, after one warm-up call;
   Lakeshore's submits, one or in batches, go through the SDK's ``Client`` as a user's
   code makes them (the peers' through their own Python APIs).

Then for each system, on a fresh store (a new PostgreSQL database per peer and for
Lakeshore on PostgreSQL, a SQLite file for Lakeshore on SQLite), one after the other:

3. drain ``--jobs`` no-op jobs, queued beforehand, with ``--workers`` worker processes,
   each running up to ``--concurrency`` jobs at once, twice: **at each system's
   defaults** — ``lakeshore daemon run --burst --capacity C`` with no other flag (its
   prefetch learned), ``pgq run ... --mode drain`` at its default ``--batch-size`` 10,
   ``procrastinate worker --one-shot --concurrency C`` — and **at its documented
   throughput setting** — Lakeshore with ``--prefetch`` (``--prefetch``, 1,000 by
   default), PgQueuer with ``--batch-size 100`` (its batch is what it dequeues ahead, as
   Lakeshore's prefetch), Procrastinate the same (it documents none). PgQueuer's own
   concurrency is left at its default (it refuses a limit under twice its batch size).
   Lakeshore's daemons talk to a real
   ``lakeshore server`` over HTTP, the peers' workers to PostgreSQL directly, as their
   users run them. The headline is from starting the workers to the last worker's exit
   (start-up counted for every system, as PgQueuer's own figures count it); beside it the
   steady rate, from the first job taken (the queued count drops, polled every 10 ms);
4. submit-to-start latency on one idle worker: ``--latency`` probes, one at a time, each
   from the client's clock just before the enqueue call to the clock read as the function
   body starts (it appends the time to a ledger file); for Lakeshore also
   ``started_at - created_at`` as its store records it (what ``bench/taskqueue.py`` takes);
5. warm state: ``--warm`` invocations of ``bench.peers_warm:work``, whose module takes
   ``PEERS_SETUP_S`` (0.3 s) of CPU to import, drained by ``--workers`` workers; the module
   appends a line to a ledger file at each import, so the count of set-ups and the time
   spent in them come from the ledger whatever ran the function (a child per invocation,
   ``--preload``, or long-lived children). Lakeshore runs it without and with ``--preload
   bench.peers_warm``.

With ``--rounds N`` (default 3) the whole sequence runs N times, every system once a
round, the order reversed in every other round: a measure that takes a second or two (the
drain) then falls in a quiet or a busy moment of a shared machine by chance, and the
systems share those chances. The table gives each measure's median over the
rounds, and a second table each round's ratios for the targets, so the spread shows.

It prints one table with the ratios Lakeshore / PgQueuer and Lakeshore / Procrastinate.

Usage (from the repository root, after ``.venv/bin/pip install -r bench/requirements.txt``)::

    .venv/bin/python bench/peers.py [--quick] [--only lakeshore|pgqueuer|procrastinate]

Every process it starts leads its own process group and is stopped, and every database
it creates dropped, before it returns, also on Ctrl-C, SIGTERM or a failure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import os
import platform
import resource
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import ExitStack, contextmanager, nullcontext, suppress
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any, ClassVar
from urllib.parse import urlsplit

import httpx
import psycopg

from lakeshore.sdk import Client

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # bench.peers_* as the workers import them
BIN = Path(sys.executable).parent
LAKESHORE = BIN / "lakeshore"
PROCRASTINATE = BIN / "procrastinate"
DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
NS = "/v1/namespaces/default"
NOOP_FN = "bench.peers_udf:noop"
STAMP_FN = "bench.peers_udf:stamp"
WARM_MODULE = "bench.peers_warm"
WARM_FN = f"{WARM_MODULE}:work"
STARTUP_TIMEOUT_S = 30.0
# PgQueuer's batch size (jobs dequeued at once, held ahead as Lakeshore's prefetch): its
# default, and the value its documentation gives for throughput
PGQ_DEFAULT_BATCH = 10
PGQ_TUNED_BATCH = 100
STOP_TIMEOUT_S = 15.0
PROBE_TIMEOUT_S = 30.0
PROBE_PAUSE_S = 0.05  # between latency probes, so each finds the worker idle
SYSTEMS = ("pgqueuer", "procrastinate", "lakeshore-sqlite", "lakeshore-postgresql")
PEERS = ("pgqueuer", "procrastinate")
LAKESHORES = ("lakeshore-sqlite", "lakeshore-postgresql")
TITLES = {
    "pgqueuer": "PgQueuer",
    "procrastinate": "Procrastinate",
    "lakeshore-sqlite": "Lakeshore SQLite",
    "lakeshore-postgresql": "Lakeshore PostgreSQL",
}


class BenchError(Exception):
    pass


# --- processes and databases, all released on the way out --------------------------------


@dataclass
class Resources:
    """Every process and database the run made; ``close`` releases what is left."""

    admin_url: str = DEFAULT_DATABASE_URL
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    databases: list[str] = field(default_factory=list)

    def start(self, args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            proc = subprocess.Popen(
                args,
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: Ctrl-C reaches only us, we stop it
            )
        self.procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
        """``sig`` to the process group, a bounded wait, then SIGKILL to the group."""
        if proc.poll() is None:
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=STOP_TIMEOUT_S)
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # anything it left in its group
        if proc in self.procs:
            self.procs.remove(proc)

    def create_database(self) -> str:
        name = f"lakeshore_bench_{secrets.token_hex(4)}"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        self.databases.append(name)
        return self.admin_url.rsplit("/", 1)[0] + f"/{name}"

    def drop_database(self, url: str) -> None:
        name = url.rsplit("/", 1)[1]
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if name in self.databases:
            self.databases.remove(name)

    def close(self) -> None:
        for proc in list(reversed(self.procs)):
            try:
                self.stop(proc)
            except Exception as exc:  # keep releasing the rest
                print(f"could not stop pid {proc.pid}: {exc}", file=sys.stderr)
        base = self.admin_url.rsplit("/", 1)[0]
        for name in list(self.databases):
            try:
                self.drop_database(f"{base}/{name}")
            except Exception as exc:
                print(f"could not drop database {name}: {exc}", file=sys.stderr)


RES = Resources()


@contextmanager
def database() -> Iterator[str]:
    url = RES.create_database()
    try:
        yield url
    finally:
        RES.drop_database(url)


def clean_env(**overrides: str) -> dict[str, str]:
    drop = ("LAKESHORE_", "PEERS_", "PGQUEUER_", "PROCRASTINATE_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = str(ROOT)
    env.update(overrides)
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_all(procs: list[subprocess.Popen[bytes]], deadline: float, what: str) -> None:
    for proc in procs:
        try:
            code = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise BenchError(f"{what}: workers still running at the deadline") from None
        if code != 0:
            raise BenchError(f"{what}: a worker exited {code}")


def wait_first_taken(
    remaining: Callable[[], int], total: int, procs: list[subprocess.Popen[bytes]], deadline: float
) -> float:
    """Poll the queued count every 10 ms; the time it first drops below ``total``."""
    while True:
        if remaining() < total:
            return time.perf_counter()
        if all(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            raise BenchError("no job was taken (workers gone or deadline passed)")
        time.sleep(0.01)


def children_cpu_s() -> float:
    """CPU seconds of every child process this run has waited for (and their children)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def process_cpu_s(pid: int) -> float:
    """CPU seconds a running process has used so far (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class OwnCpu:
    """The CPU time worker processes spend themselves, without their children: a thread
    reads each one's ``/proc/PID/stat`` every ``every_s`` until it exits, and keeps the
    last reading (at most that interval of its time is lost at its end)."""

    def __init__(self, every_s: float = 0.02) -> None:
        self.every_s = every_s
        self.procs: list[subprocess.Popen[bytes]] = []
        self.last: dict[int, float] = {}
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def watch(self, procs: list[subprocess.Popen[bytes]]) -> None:
        self.procs = list(procs)
        self.thread.start()

    def _watch(self) -> None:
        while not self.stopping.wait(self.every_s):
            for proc in self.procs:
                with suppress(OSError, IndexError, ValueError):
                    if proc.returncode is None:
                        self.last[proc.pid] = process_cpu_s(proc.pid)

    def seconds(self) -> float:
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join()
        return sum(self.last.values())


class BackendCpu:
    """The CPU time PostgreSQL's backends spend on one database while it runs: every
    ``every_s`` a thread lists the backends connected to it (``pg_stat_activity``, from
    the admin database) and reads each one's CPU time so far (``/proc/PID/stat``; the
    server runs on this machine). A backend that ends between two looks loses at most
    that interval of its time; one there before the start counts from the start."""

    def __init__(self, dsn: str, every_s: float = 0.05) -> None:
        self.database = urlsplit(dsn).path.lstrip("/")
        self.every_s = every_s
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="backend-cpu", daemon=True)

    def __enter__(self) -> BackendCpu:
        with psycopg.connect(RES.admin_url, autocommit=True) as conn:
            self.first = self._look(conn)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def seconds(self) -> float:
        return sum(cpu - self.first.get(pid, 0.0) for pid, cpu in self.last.items())

    def _watch(self) -> None:
        with psycopg.connect(RES.admin_url, autocommit=True) as conn:
            while True:
                self.last.update(self._look(conn))
                if self._stop.wait(self.every_s):
                    self.last.update(self._look(conn))
                    return

    def _look(self, conn: psycopg.Connection[Any]) -> dict[int, float]:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s", [self.database]
        ).fetchall()
        seen = {}
        for (pid,) in rows:
            with suppress(OSError, IndexError, ValueError):  # ended meanwhile
                seen[int(pid)] = process_cpu_s(int(pid))
        return seen


def timed_drain(
    start: Callable[[], list[subprocess.Popen[bytes]]],
    remaining: Callable[[], int],
    total: int,
    timeout_s: float,
    what: str,
    server_pid: int | None = None,
    dsn: str | None = None,
    prefix: str = "",
) -> dict[str, float]:
    """Start the workers, wait for all to exit: jobs/s from the first taken and wall, and
    the CPU the workers (with their children), the server and, with ``dsn`` (a
    PostgreSQL database), the database's backends used, in ms per job; each figure's key
    begins with ``prefix`` (``tuned_``: the throughput setting's drain)."""
    procs: list[subprocess.Popen[bytes]] = []
    own = OwnCpu()
    cpu_before = children_cpu_s()
    server_before = process_cpu_s(server_pid) if server_pid else 0.0
    backends = BackendCpu(dsn) if dsn else None
    try:
        with backends if backends is not None else nullcontext():
            started = time.perf_counter()
            procs = start()
            own.watch(procs)
            deadline = time.monotonic() + timeout_s
            first = wait_first_taken(remaining, total, procs, deadline)
            wait_all(procs, deadline, what)
            ended = time.perf_counter()
        measured = {
            "drain": total / (ended - first),
            "drain_wall": total / (ended - started),
            "drain_worker_cpu": (children_cpu_s() - cpu_before) * 1000 / total,
        }
        if server_pid:  # Lakeshore's daemons run their jobs in children of their own
            measured["drain_daemon_cpu"] = own.seconds() * 1000 / total
        if server_pid:
            measured["drain_server_cpu"] = (
                (process_cpu_s(server_pid) - server_before) * 1000 / total
            )
        if backends is not None:
            measured["drain_pg_cpu"] = backends.seconds() * 1000 / total
    finally:
        own.stopping.set()
        for proc in procs:
            RES.stop(proc)
    return {prefix + key: value for key, value in measured.items()}


# --- ledgers -------------------------------------------------------------------------------


class Ledger:
    """Reads the ``TAG TIME`` lines ``bench.peers_udf.stamp`` appends."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.seen: dict[str, float] = {}
        path.touch()

    def poll(self) -> None:
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1  # whole lines only
        self.offset += end
        for line in data[:end].decode().splitlines():
            tag, at = line.split()
            self.seen[tag] = float(at)

    def wait(self, tag: str, timeout_s: float = PROBE_TIMEOUT_S) -> float:
        deadline = time.monotonic() + timeout_s
        while tag not in self.seen:
            if time.monotonic() > deadline:
                raise BenchError(f"latency probe {tag} did not start in {timeout_s:.0f}s")
            time.sleep(0.001)
            self.poll()
        return self.seen[tag]


def read_setups(path: Path) -> tuple[int, float]:
    """(set-ups run, seconds spent in them) from ``bench.peers_warm``'s ledger."""
    if not path.exists():
        return 0, 0.0
    runs, spent = 0, 0.0
    for line in path.read_text().splitlines():
        _, _pid, _ppid, start, end = line.split()
        runs += 1
        spent += float(end) - float(start)
    return runs, spent


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))
    return ordered[index]


# --- options -----------------------------------------------------------------------------


@dataclass
class Run:
    """One system's run: its options, scratch dir and results."""

    system: str
    opts: argparse.Namespace
    workdir: Path
    results: dict[str, float] = field(default_factory=dict)

    def log(self, name: str) -> Path:
        return self.workdir / f"{name}.log"


# --- Lakeshore -----------------------------------------------------------------------------


def check(response: httpx.Response, *codes: int) -> Any:
    if response.status_code not in codes:
        raise BenchError(f"{response.request.url}: {response.status_code} {response.text[:300]}")
    return response.json()


@dataclass
class Lakeshore:
    run: Run
    url: str
    token: str
    server: subprocess.Popen[bytes]
    http: httpx.Client
    sdk: Client  # submits go through the SDK, as a user's code makes them
    db: str  # the server's --db: a PostgreSQL URL or a SQLite file

    def submit(self, queue: str, fn: str, args: list[Any] | None = None) -> str:
        """One submit, through the SDK's ``Client.submit``: the invocation's id."""
        return self.sdk.submit(queue, fn, args or ()).id

    def submit_batches(self, queue: str, fn: str, total: int) -> None:
        """``total`` submits through the SDK's ``Client.submit_many``, ``--batch-size``
        to a request."""
        size = self.run.opts.batch_size
        for start in range(0, total, size):
            self.sdk.submit_many(queue, fn, [()] * min(size, total - start))

    def stats(self, queue: str) -> dict[str, int]:
        return check(self.http.get(f"{NS}/queues/{queue}/stats"), 200)["byState"]  # type: ignore[no-any-return]

    def daemon(
        self,
        queue: str,
        name: str,
        *,
        burst: bool,
        extra: tuple[str, ...] = (),
        tuned: bool = False,
    ) -> subprocess.Popen[bytes]:
        """A daemon with no flags but the workload's (``--capacity``, ``--runner``), or
        ``tuned``: with the recommended ``--prefetch`` as well."""
        env = clean_env(
            LAKESHORE_URL=self.url,
            LAKESHORE_TOKEN=self.token,
            PEERS_SETUP_LEDGER=str(self.run.workdir / f"{queue}.setups"),
        )
        args = [str(LAKESHORE), "daemon", "run", "--queue", queue]
        args += ["--capacity", str(self.run.opts.concurrency), *extra]
        args += ["--runner", self.run.opts.runner]
        if tuned:
            args += ["--prefetch", str(self.run.opts.prefetch)]
        if burst:
            args.append("--burst")
        return RES.start(args, self.run.log(name), env)


@contextmanager
def lakeshore_server(db: str, run: Run) -> Iterator[Lakeshore]:
    token = secrets.token_urlsafe(24)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = [str(LAKESHORE), "server", "--host", "127.0.0.1", "--port", str(port), "--db", db]
    args += ["--data-dir", str(run.workdir / "data"), "--log-level", "warning"]
    server = RES.start(args, run.log("server"), clean_env(LAKESHORE_ADMIN_TOKEN=token))
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if server.poll() is not None:
                raise BenchError(f"server exited {server.returncode}; see {run.log('server')}")
            with suppress(httpx.TransportError):
                if httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise BenchError(f"server not healthy in {STARTUP_TIMEOUT_S:.0f}s")
            time.sleep(0.1)
        headers = {"Authorization": f"Bearer {token}"}
        with (
            httpx.Client(base_url=url, headers=headers, timeout=60) as http,
            Client(url, token) as sdk,
        ):
            yield Lakeshore(run, url, token, server, http, sdk, db)
    finally:
        RES.stop(server)


def ls_drain(ls: Lakeshore, *, tuned: bool = False) -> None:
    opts = ls.run.opts
    queue = "drain-tuned" if tuned else "drain"
    ls.submit_batches(queue, NOOP_FN, opts.jobs)

    def start() -> list[subprocess.Popen[bytes]]:
        procs = [
            ls.daemon(queue, f"{queue}-{n}", burst=True, tuned=tuned) for n in range(opts.workers)
        ]
        if opts.profile_dir:
            profile_start(ls, procs[0])
        return procs

    try:
        measured = timed_drain(
            start,
            lambda: ls.stats(queue)["pending"],
            opts.jobs,
            opts.timeout,
            queue,
            server_pid=ls.server.pid,
            dsn=ls.db if ls.db.startswith("postgresql") else None,
            prefix="tuned_" if tuned else "",
        )
    finally:
        profile_stop(ls)
    by_state = ls.stats(queue)
    if by_state["succeeded"] != opts.jobs:
        raise BenchError(f"drain: expected {opts.jobs} succeeded, stats say {by_state}")
    ls.run.results.update(measured)


def parse_ts(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def ls_latency(ls: Lakeshore) -> None:
    ledger = Ledger(ls.run.workdir / "latency.ledger")
    ls.submit("latency", STAMP_FN, [str(ledger.path), "warmup"])  # creates the queue
    daemon = ls.daemon("latency", "latency", burst=False)
    client: list[float] = []
    store: list[float] = []
    try:
        ledger.wait("warmup", timeout_s=60)
        time.sleep(0.3)  # back to long-polling: the worker is idle
        for n in range(ls.run.opts.latency):
            tag = f"p{n}"
            sent = time.time()
            invocation_id = ls.submit("latency", STAMP_FN, [str(ledger.path), tag])
            client.append((ledger.wait(tag) - sent) * 1000)
            time.sleep(PROBE_PAUSE_S)
            record = check(ls.http.get(f"{NS}/invocations/{invocation_id}"), 200)
            started = parse_ts(record["started_at"]) - parse_ts(record["created_at"])
            store.append(started.total_seconds() * 1000)
    finally:
        RES.stop(daemon)
    put_latency(ls.run.results, client, store)


def put_latency(results: dict[str, float], client: list[float], store: list[float]) -> None:
    results["lat_p50"], results["lat_p99"] = percentile(client, 50), percentile(client, 99)
    if store:
        results["store_p50"], results["store_p99"] = percentile(store, 50), percentile(store, 99)


def ls_warm(ls: Lakeshore, preload: bool) -> None:
    opts = ls.run.opts
    queue = "warm-preload" if preload else "warm"
    extra = ("--preload", WARM_MODULE) if preload else ()
    ls.submit_batches(queue, WARM_FN, opts.warm)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        started = time.perf_counter()
        for n in range(opts.workers):
            procs.append(ls.daemon(queue, f"{queue}-{n}", burst=True, extra=extra))
        wait_all(procs, time.monotonic() + opts.timeout, queue)
        elapsed = time.perf_counter() - started
    finally:
        for proc in procs:
            RES.stop(proc)
    by_state = ls.stats(queue)
    if by_state["succeeded"] != opts.warm:
        raise BenchError(f"{queue}: expected {opts.warm} succeeded, stats say {by_state}")
    put_warm(ls.run, "warm_pre" if preload else "warm", ls.run.workdir / f"{queue}.setups", elapsed)


def put_warm(run: Run, key: str, ledger: Path, elapsed: float) -> None:
    runs, spent = read_setups(ledger)
    run.results[f"{key}_runs"] = runs
    run.results[f"{key}_setup_s"] = spent
    run.results[f"{key}_rate"] = run.opts.warm / elapsed


def run_lakeshore(system: str, opts: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix=f"peers-{system}-") as tmp:
        run = Run(system, opts, Path(tmp))
        store = database() if system == "lakeshore-postgresql" else nullpath(run)
        with store as db, lakeshore_server(db, run) as ls:
            steps: list[tuple[str, Callable[[], None]]] = [
                ("drain, no flags", lambda: ls_drain(ls)),
                (f"drain, --prefetch {opts.prefetch}", lambda: ls_drain(ls, tuned=True)),
                ("latency", lambda: ls_latency(ls)),
                ("warm state", lambda: ls_warm(ls, preload=False)),
                ("warm state, --preload", lambda: ls_warm(ls, preload=True)),
            ]
            run_steps(run, steps)
        return run.results


@contextmanager
def nullpath(run: Run) -> Iterator[str]:
    yield str(run.workdir / "bench.db")


def run_steps(run: Run, steps: list[tuple[str, Callable[[], None]]]) -> None:
    for name, step in steps:
        before = set(run.results)
        started = time.perf_counter()
        step()
        shown = ", ".join(f"{k} {fmt(k, run.results[k])}" for k in run.results if k not in before)
        print(f"  {name} ({time.perf_counter() - started:.0f} s): {shown}", flush=True)


# --- profiling (optional: py-spy, not a requirement) ---------------------------------------

_profilers: list[tuple[subprocess.Popen[bytes], Path]] = []


def profile_start(ls: Lakeshore, daemon: subprocess.Popen[bytes]) -> None:
    py_spy = shutil.which("py-spy", path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    if py_spy is None:
        raise BenchError("--profile-dir needs py-spy (not a requirement of the project)")
    out_dir = Path(ls.run.opts.profile_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    system = ls.run.system.removeprefix("lakeshore-")
    for who, proc in (("server", ls.server), ("daemon", daemon)):
        out = out_dir / f"{system}-{who}.txt"
        rate = str(ls.run.opts.profile_rate)
        args = [py_spy, "record", "--pid", str(proc.pid), "--format", "raw", "--rate", rate]
        args += ["--nonblocking", "--output", str(out)]
        if who == "daemon":
            args.append("--subprocesses")  # its pool children run the jobs
        _profilers.append((RES.start(args, ls.run.log(f"py-spy-{who}"), clean_env()), out))


def profile_stop(ls: Lakeshore) -> None:
    while _profilers:
        proc, out = _profilers.pop()
        RES.stop(proc, signal.SIGINT)  # py-spy writes its output on SIGINT
        if out.exists():
            summary = summarise_profile(out)
            out.with_suffix(".summary").write_text(summary)
            print(f"  profile {out.name}:\n{summary}", flush=True)


def summarise_profile(path: Path, top: int = 10) -> str:
    """Where the samples of py-spy's collapsed stacks went, three ways.

    By the package of the innermost frame (self time); by the innermost Lakeshore frame
    (its own time plus the libraries it called); by the first frame under
    ``lakeshore/api/routes`` or ``lakeshore/daemon`` (which route or daemon step).
    """
    leaf_pkg: Counter[str] = Counter()
    deepest_own: Counter[str] = Counter()
    entry: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [parse_frame(f) for f in stack.split(";") if f]
        if not frames:
            continue
        samples = int(count)
        total += samples
        leaf_pkg[frames[-1][1].split("/")[0].removesuffix(".py")] += samples
        own = [f for f in frames if f[1].startswith("lakeshore/")]
        deepest_own[own[-1][0] if own else "(no Lakeshore frame)"] += samples
        routes = [f for f in own if f[1].startswith(("lakeshore/api/routes", "lakeshore/daemon"))]
        entry[routes[0][0] if routes else "(other)"] += samples
    if not total:
        return "    no samples\n"
    out = [f"    {total} samples (100 Hz, busy threads only)"]
    for title, counter in (
        ("innermost frame's package (self time)", leaf_pkg),
        ("innermost Lakeshore frame (with the libraries it called)", deepest_own),
        ("route handler or daemon step", entry),
    ):
        out.append(f"    {title}:")
        out += [f"      {n / total:6.1%}  {name}" for name, n in counter.most_common(top)]
    return "\n".join(out) + "\n"


def parse_frame(frame: str) -> tuple[str, str]:
    """``func (pkg/mod.py:12)`` -> (``func pkg/mod.py``, ``pkg/mod.py``)."""
    func, _, where = frame.partition(" (")
    file = where.rsplit(":", 1)[0].rstrip(")")
    return f"{func} {file}", file


# --- peers ---------------------------------------------------------------------------------


class Peer:
    """What differs between PgQueuer and Procrastinate; ``run_peer`` does the rest."""

    name = ""

    async def install(self, dsn: str) -> None:
        raise NotImplementedError

    def enqueuer(self, dsn: str) -> contextlib.AbstractAsyncContextManager[Enqueue]:
        """(one batch of a size, one single enqueue) of the "enqueue" jobs no worker
        serves, on connections kept open for the enqueue phase."""
        raise NotImplementedError

    async def fill(self, dsn: str, kind: str, total: int, size: int) -> None:
        raise NotImplementedError

    async def probe(self, dsn: str, ledger: Ledger, count: int) -> list[float]:
        raise NotImplementedError

    def worker_args(
        self, kind: str, concurrency: int, burst: bool, tuned: bool = False
    ) -> list[str]:
        """A worker at the peer's defaults, or ``tuned``: at its documented throughput
        setting (the same where it has none)."""
        raise NotImplementedError

    def queued_sql(self) -> str:
        """The count of still-queued jobs of one kind (``%s``, see ``queued_key``)."""
        raise NotImplementedError

    def queued_key(self, kind: str) -> str:
        return kind

    async def succeeded(self, dsn: str, kind: str) -> int:
        raise NotImplementedError

    async def forget(self, dsn: str, kind: str) -> None:
        """Forget the finished jobs of ``kind``, so that the next drain counts its own."""
        raise NotImplementedError


async def probe_loop(ledger: Ledger, count: int, enqueue: Callable[[str], Any]) -> list[float]:
    """``count`` probes: enqueue one, wait for its body to start, pause; latencies in ms."""
    await enqueue("warmup")
    await asyncio.to_thread(ledger.wait, "warmup", 60)
    await asyncio.sleep(0.3)
    latencies = []
    for n in range(count):
        tag = f"p{n}"
        sent = time.time()
        await enqueue(tag)
        latencies.append((await asyncio.to_thread(ledger.wait, tag) - sent) * 1000)
        await asyncio.sleep(PROBE_PAUSE_S)
    return latencies


class PgQueuerPeer(Peer):
    """PgQueuer on asyncpg: ``Queries.enqueue`` with lists for batches, scalars for one."""

    name = "pgqueuer"

    async def _queries(self, dsn: str) -> Any:
        import asyncpg
        from pgqueuer.db import AsyncpgDriver
        from pgqueuer.queries import Queries

        connection = await asyncpg.connect(dsn)
        return connection, Queries(AsyncpgDriver(connection))

    async def install(self, dsn: str) -> None:
        connection, queries = await self._queries(dsn)
        try:
            await queries.install()
        finally:
            await connection.close()

    @contextlib.asynccontextmanager
    async def enqueuer(self, dsn: str) -> AsyncIterator[Enqueue]:
        connection, q = await self._queries(dsn)
        try:

            async def batch(size: int) -> None:
                await q.enqueue(["enqueue"] * size, [None] * size, [0] * size)

            async def single() -> None:
                await q.enqueue("enqueue", None)

            yield batch, single
        finally:
            await connection.close()

    async def fill(self, dsn: str, kind: str, total: int, size: int) -> None:
        connection, q = await self._queries(dsn)
        try:
            for start in range(0, total, size):
                n = min(size, total - start)
                await q.enqueue([kind] * n, [None] * n, [0] * n)
        finally:
            await connection.close()

    async def probe(self, dsn: str, ledger: Ledger, count: int) -> list[float]:
        connection, q = await self._queries(dsn)

        async def enqueue(tag: str) -> None:
            await q.enqueue("stamp", f"{ledger.path}\n{tag}".encode())

        try:
            return await probe_loop(ledger, count, enqueue)
        finally:
            await connection.close()

    def worker_args(
        self, kind: str, concurrency: int, burst: bool, tuned: bool = False
    ) -> list[str]:
        """``--batch-size`` (jobs dequeued ahead, as Lakeshore's prefetch): its default
        10, or the 100 its documentation gives for throughput. Its concurrency is left at
        its default (PgQueuer refuses a ``max_concurrent_tasks`` under twice the batch):
        its async jobs run as its batches allow."""
        mode = "drain" if burst else "continuous"
        batch = PGQ_TUNED_BATCH if tuned else PGQ_DEFAULT_BATCH
        return [sys.executable, "-m", "bench.peers_pgq", mode, str(batch)]

    def queued_sql(self) -> str:
        return "SELECT count(*) FROM pgqueuer WHERE entrypoint = %s AND status = 'queued'"

    async def succeeded(self, dsn: str, kind: str) -> int:
        connection, q = await self._queries(dsn)
        try:
            left = await connection.fetchval(
                "SELECT count(*) FROM pgqueuer WHERE entrypoint = $1", kind
            )
            if left:
                return -int(left)
            stats = await q.log_statistics(limit=None)
            return sum(s.count for s in stats if s.entrypoint == kind and s.status == "successful")
        finally:
            await connection.close()

    async def forget(self, dsn: str, kind: str) -> None:
        connection, _ = await self._queries(dsn)
        try:
            await connection.execute("DELETE FROM pgqueuer_statistics WHERE entrypoint = $1", kind)
        finally:
            await connection.close()


class ProcrastinatePeer(Peer):
    """Procrastinate on its async ``PsycopgConnector``: ``defer_async``, ``batch_defer_async``."""

    name = "procrastinate"
    queues: ClassVar[dict[str, str]] = {"noop": "drain", "stamp": "latency", "warm": "warm"}
    tasks: ClassVar[dict[str, str]] = {"noop": "drain_noop", "stamp": "stamp", "warm": "warm"}

    @contextmanager
    def app(self, dsn: str) -> Iterator[Any]:
        import procrastinate
        from bench.peers_procrastinate import app

        with app.replace_connector(procrastinate.PsycopgConnector(conninfo=dsn)) as replaced:
            yield replaced

    async def install(self, dsn: str) -> None:
        with self.app(dsn) as app:
            async with app.open_async():
                await app.schema_manager.apply_schema_async()

    @contextlib.asynccontextmanager
    async def enqueuer(self, dsn: str) -> AsyncIterator[Enqueue]:
        with self.app(dsn) as app:
            async with app.open_async():
                task = app.tasks["enqueue_noop"]

                async def batch(size: int) -> None:
                    await task.batch_defer_async(*([{}] * size))

                async def single() -> None:
                    await task.defer_async()

                yield batch, single

    async def fill(self, dsn: str, kind: str, total: int, size: int) -> None:
        with self.app(dsn) as app:
            async with app.open_async():
                task = app.tasks[self.tasks[kind]]
                for start in range(0, total, size):
                    await task.batch_defer_async(*([{}] * min(size, total - start)))

    async def probe(self, dsn: str, ledger: Ledger, count: int) -> list[float]:
        with self.app(dsn) as app:
            async with app.open_async():
                task = app.tasks["stamp"]

                async def enqueue(tag: str) -> None:
                    await task.defer_async(ledger=str(ledger.path), tag=tag)

                return await probe_loop(ledger, count, enqueue)

    def worker_args(
        self, kind: str, concurrency: int, burst: bool, tuned: bool = False
    ) -> list[str]:
        # no documented throughput setting beyond the workload's --concurrency: the same
        args = [str(PROCRASTINATE), "--app=bench.peers_procrastinate.app", "worker"]
        args += [f"--queues={self.queues[kind]}", f"--concurrency={concurrency}"]
        return [*args, "--one-shot" if burst else "--wait"]

    def queued_sql(self) -> str:
        return "SELECT count(*) FROM procrastinate_jobs WHERE queue_name = %s AND status = 'todo'"

    def queued_key(self, kind: str) -> str:
        return self.queues[kind]

    async def succeeded(self, dsn: str, kind: str) -> int:
        sql = "SELECT count(*) FROM procrastinate_jobs WHERE queue_name = %s AND status = %s"
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            cursor = await conn.execute(sql, (self.queues[kind], "succeeded"))
            row = await cursor.fetchone()
        return int(row[0]) if row else 0

    async def forget(self, dsn: str, kind: str) -> None:
        sql = "DELETE FROM procrastinate_jobs WHERE queue_name = %s AND status = 'succeeded'"
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            await conn.execute(sql, (self.queues[kind],))


@dataclass
class PeerRun:
    peer: Peer
    run: Run
    dsn: str
    conns: list[psycopg.Connection[Any]] = field(default_factory=list)

    def workers(
        self, kind: str, *, burst: bool, count: int, tuned: bool = False
    ) -> list[subprocess.Popen[bytes]]:
        env = clean_env(
            PEERS_DSN=self.dsn, PEERS_SETUP_LEDGER=str(self.run.workdir / f"{kind}.setups")
        )
        args = self.peer.worker_args(kind, self.run.opts.concurrency, burst, tuned)
        return [RES.start(args, self.run.log(f"{kind}-{n}"), env) for n in range(count)]

    def queued(self, kind: str) -> Callable[[], int]:
        conn = psycopg.connect(self.dsn, autocommit=True)
        self.conns.append(conn)
        sql, key = self.peer.queued_sql(), self.peer.queued_key(kind)

        def count() -> int:
            row = conn.execute(sql, (key,)).fetchone()
            return int(row[0]) if row else 0

        return count

    def close(self) -> None:
        for conn in self.conns:
            conn.close()

    def drain(self, tuned: bool = False) -> None:
        opts = self.run.opts
        asyncio.run(self.peer.fill(self.dsn, "noop", opts.jobs, opts.batch_size))
        measured = timed_drain(
            lambda: self.workers("noop", burst=True, count=opts.workers, tuned=tuned),
            self.queued("noop"),
            opts.jobs,
            opts.timeout,
            f"{self.peer.name} drain",
            dsn=self.dsn,
            prefix="tuned_" if tuned else "",
        )
        self.expect("noop", opts.jobs)
        self.run.results.update(measured)
        asyncio.run(self.peer.forget(self.dsn, "noop"))  # the next drain counts its own

    def expect(self, kind: str, total: int) -> None:
        done = asyncio.run(self.peer.succeeded(self.dsn, kind))
        if done != total:
            raise BenchError(f"{self.peer.name} {kind}: {done} succeeded, expected {total}")

    def latency(self) -> None:
        ledger = Ledger(self.run.workdir / "latency.ledger")
        procs = self.workers("stamp", burst=False, count=1)
        try:
            client = asyncio.run(self.peer.probe(self.dsn, ledger, self.run.opts.latency))
        finally:
            for proc in procs:
                RES.stop(proc)
        put_latency(self.run.results, client, [])

    def warm(self) -> None:
        opts = self.run.opts
        asyncio.run(self.peer.fill(self.dsn, "warm", opts.warm, opts.batch_size))
        procs: list[subprocess.Popen[bytes]] = []
        try:
            started = time.perf_counter()
            procs = self.workers("warm", burst=True, count=opts.workers)
            wait_all(procs, time.monotonic() + opts.timeout, f"{self.peer.name} warm")
            elapsed = time.perf_counter() - started
        finally:
            for proc in procs:
                RES.stop(proc)
        self.expect("warm", opts.warm)
        put_warm(self.run, "warm", self.run.workdir / "warm.setups", elapsed)


def run_peer(peer: Peer, opts: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix=f"peers-{peer.name}-") as tmp, database() as dsn:
        pr = PeerRun(peer, Run(peer.name, opts, Path(tmp)), dsn)
        try:
            asyncio.run(peer.install(dsn))
            steps: list[tuple[str, Callable[[], None]]] = [
                ("drain, defaults", pr.drain),
                ("drain, throughput setting", lambda: pr.drain(tuned=True)),
                ("latency", pr.latency),
                ("warm state", pr.warm),
            ]
            run_steps(pr.run, steps)
        finally:
            pr.close()
        return pr.run.results


# --- the table -----------------------------------------------------------------------------

# key, label, unit kind; ratios are Lakeshore / peer for every row.
ROWS = [
    ("batch", "enqueue, batches of {batch_size} (jobs/s)", "rate"),
    ("single", "enqueue, one call per job (jobs/s)", "rate"),
    (
        "drain_wall",
        "drain {jobs} no-ops, {workers} workers, defaults: started→done (jobs/s)",
        "rate",
    ),
    ("drain", "  the same, steady: first taken→done (jobs/s)", "rate"),
    ("drain_worker_cpu", "drain: CPU of workers + their children (ms/job)", "ms"),
    ("drain_daemon_cpu", "drain: of which the daemons alone, without children (ms/job)", "ms"),
    ("drain_server_cpu", "drain: CPU of the Lakeshore server (ms/job)", "ms"),
    ("drain_pg_cpu", "drain: CPU of PostgreSQL's backends (ms/job)", "ms"),
    ("tuned_drain_wall", "drain, throughput setting: started→done (jobs/s)", "rate"),
    ("tuned_drain", "  the same, steady: first taken→done (jobs/s)", "rate"),
    ("tuned_drain_worker_cpu", "  tuned drain: CPU of workers + children (ms/job)", "ms"),
    ("tuned_drain_server_cpu", "  tuned drain: CPU of the Lakeshore server (ms/job)", "ms"),
    ("tuned_drain_pg_cpu", "  tuned drain: CPU of PostgreSQL's backends (ms/job)", "ms"),
    ("lat_p50", "submit→start p50, call→body, idle worker (ms)", "ms"),
    ("lat_p99", "submit→start p99, call→body, idle worker (ms)", "ms"),
    ("store_p50", "submit→start p50, store's created→started (ms)", "ms"),
    ("store_p99", "submit→start p99, store's created→started (ms)", "ms"),
    ("warm_runs", "warm state, {warm} invocations: set-ups run", "count"),
    ("warm_setup_s", "warm state: time in set-up, all processes (s)", "s"),
    ("warm_rate", "warm state: invocations/s", "rate"),
    ("warm_pre_runs", "warm state, --preload: set-ups run", "count"),
    ("warm_pre_setup_s", "warm state, --preload: time in set-up (s)", "s"),
    ("warm_pre_rate", "warm state, --preload: invocations/s", "rate"),
]
UNITS = {key: unit for key, _, unit in ROWS}


def fmt(key: str, value: float | None) -> str:
    if value is None:
        return "—"
    unit = UNITS.get(key, "rate")
    if unit == "rate":
        return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"
    if unit == "count":
        return f"{value:,.0f}"
    return f"{value:,.2f}" if value < 1 else f"{value:,.1f}"


def ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return "—"
    r = a / b
    return f"{r:.2f}x" if r >= 0.1 else f"{r:.3f}x"


def table(results: dict[str, dict[str, float]], opts: argparse.Namespace) -> str:
    systems = [s for s in SYSTEMS if s in results]
    pairs = [(ls, p) for p in PEERS for ls in LAKESHORES if ls in results and p in results]
    heads = ["measure", *(TITLES[s] for s in systems)]
    heads += [f"{TITLES[ls].split()[1]} ÷ {TITLES[p]}" for ls, p in pairs]
    rows = []
    for key, label, _ in ROWS:
        values = [results[s].get(key) for s in systems]
        if all(v is None for v in values):
            continue
        cells = [label.format(**vars(opts)), *(fmt(key, v) for v in values)]
        cells += [ratio(results[ls].get(key), results[p].get(key)) for ls, p in pairs]
        rows.append(cells)
    widths = [max(len(r[i]) for r in [heads, *rows]) for i in range(len(heads))]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(heads, widths, strict=True)) + " |"]
    lines.append(
        "|" + "|".join("-" * (w + 1) + (":" if i else "-") for i, w in enumerate(widths)) + "|"
    )
    for r in rows:
        cells = [r[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --- enqueue, every system in turn ------------------------------------------------------------

Enqueue = tuple[Callable[[int], Awaitable[None]], Callable[[], Awaitable[None]]]
SyncEnqueue = tuple[Callable[[int], object], Callable[[], object]]
SLICES = 10  # each system's enqueues, cut into this many turns


@contextmanager
def enqueuer(system: str, opts: argparse.Namespace, workdir: Path) -> Iterator[SyncEnqueue]:
    """``system``'s (batch, single) enqueue calls, ready to be called from this thread,
    on a fresh store of its own."""
    if system in LAKESHORES:
        run = Run(system, opts, workdir / system)
        run.workdir.mkdir()
        store = database() if system == "lakeshore-postgresql" else nullpath(run)
        with store as db, lakeshore_server(db, run) as ls:
            yield (
                lambda size: ls.sdk.submit_many("enqueue-batch", NOOP_FN, [()] * size),
                lambda: ls.sdk.submit("enqueue-single", NOOP_FN),
            )
        return
    peer: Peer = PgQueuerPeer() if system == "pgqueuer" else ProcrastinatePeer()
    loop = asyncio.new_event_loop()
    try:
        with database() as dsn:
            loop.run_until_complete(peer.install(dsn))
            opened = peer.enqueuer(dsn)
            batch, single = loop.run_until_complete(opened.__aenter__())
            try:
                yield (
                    lambda size: loop.run_until_complete(batch(size)),
                    lambda: loop.run_until_complete(single()),
                )
            finally:
                loop.run_until_complete(opened.__aexit__(None, None, None))
    finally:
        loop.close()


def enqueue_in_turn(systems: list[str], opts: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Every system's enqueues, the same work as one after the other, but cut into
    ``SLICES`` turns, the systems taking turns in a rotating order while all are up: a
    busy moment of a shared machine falls on all of them alike. Rates are the calls
    made over the time spent in them."""
    spent = {system: {"batch": 0.0, "single": 0.0} for system in systems}
    with tempfile.TemporaryDirectory(prefix="peers-enqueue-") as tmp, ExitStack() as stack:
        calls = {s: stack.enter_context(enqueuer(s, opts, Path(tmp))) for s in systems}
        for batch, single in calls.values():  # warm-ups: a batch and a single call each
            batch(opts.batch_size)
            single()
        batches = _shares(opts.batches, SLICES)
        singles = _shares(opts.single, SLICES)
        for turn in range(SLICES):
            order = systems[turn % len(systems) :] + systems[: turn % len(systems)]
            for system in order:
                batch, single = calls[system]
                started = time.perf_counter()
                for _ in range(batches[turn]):
                    batch(opts.batch_size)
                spent[system]["batch"] += time.perf_counter() - started
            for system in order:
                batch, single = calls[system]
                started = time.perf_counter()
                for _ in range(singles[turn]):
                    single()
                spent[system]["single"] += time.perf_counter() - started
    return {
        system: {
            "batch": opts.batches * opts.batch_size / times["batch"],
            "single": opts.single / times["single"],
        }
        for system, times in spent.items()
    }


def _shares(total: int, parts: int) -> list[int]:
    """``total`` cut into ``parts`` near-equal whole shares."""
    return [total // parts + (1 if n < total % parts else 0) for n in range(parts)]


def medians(runs: list[dict[str, float]]) -> dict[str, float]:
    """Each measure's median over the rounds that have it."""
    keys = dict.fromkeys(key for run in runs for key in run)
    return {key: statistics.median(run[key] for run in runs if key in run) for key in keys}


TARGETS = (
    ("single", "single submit"),
    ("batch", "batch submit"),
    ("drain_wall", "drain, defaults"),
    ("tuned_drain_wall", "drain, tuned"),
    ("lat_p50", "p50"),
)


def round_table(rounds: dict[str, list[dict[str, float]]], count: int) -> str:
    """Per round, each Lakeshore store's ratio to PgQueuer on the targets' rows (the p99
    as milliseconds: its target is a bound, not a ratio)."""
    peer = rounds.get("pgqueuer")
    lines = []
    for ls in (s for s in LAKESHORES if s in rounds):
        title = TITLES[ls].split()[1]
        heads = [f"{title}: {label} ÷ PgQueuer" for _, label in TARGETS if peer] + [
            f"{title}: p99 ms"
        ]
        lines.append("| round | " + " | ".join(heads) + " |")
        lines.append("|---:|" + "---:|" * len(heads))
        for n in range(count):
            ours = rounds[ls][n]
            cells = [ratio(ours.get(key), peer[n].get(key)) for key, _ in TARGETS] if peer else []
            cells.append(fmt("lat_p99", ours.get("lat_p99")))
            lines.append(f"| {n + 1} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines).rstrip()


# --- main ------------------------------------------------------------------------------------


def header() -> str:
    def run(*args: str) -> str:
        done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, check=False)
        return done.stdout.strip() or "?"

    changed = run("git", "status", "--porcelain", "--", "src").splitlines()
    model = "unknown"
    with open("/proc/cpuinfo") as f:
        model = next(
            (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), model
        )
    versions = ", ".join(
        f"{p} {version(p)}" for p in ("pgqueuer", "asyncpg", "procrastinate", "psycopg", "uvloop")
    )
    return "\n".join(
        [
            f"commit: {run('git', 'rev-parse', '--short', 'HEAD')}"
            + (f" (+ {len(changed)} uncommitted files under src/)" if changed != ["?"] else ""),
            f"machine: nproc {run('nproc')}, {model}",
            f"python: {platform.python_version()}; {versions}",
            f"postgresql: {server_version()}",
            f"load average at start: {load()}",
        ]
    )


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg()) + " (1, 5, 15 min)"


def version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def server_version() -> str:
    with psycopg.connect(RES.admin_url, autocommit=True) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return str(row[0]) if row else "?"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000, help="no-op jobs to drain")
    parser.add_argument("--batches", type=int, default=10, help="batches to enqueue")
    parser.add_argument("--batch-size", type=int, default=1_000, help="jobs per batch")
    parser.add_argument("--single", type=int, default=1_000, help="one-call enqueues")
    parser.add_argument("--latency", type=int, default=200, help="latency probes")
    parser.add_argument("--warm", type=int, default=200, help="warm-state invocations")
    parser.add_argument("--workers", type=int, default=2, help="worker processes per drain")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=8,
        help="jobs at once per worker (Lakeshore's --capacity)",
    )
    parser.add_argument(
        "--runner",
        default="process",
        choices=("process", "thread"),
        help="how Lakeshore's daemons run invocations (--runner of lakeshore daemon run)",
    )
    parser.add_argument(
        "--prefetch",
        type=int,
        default=1000,
        help=(
            "invocations each Lakeshore daemon claims beyond its capacity (--prefetch; "
            "enough to cover a few report round trips at the drain's pace, see "
            "docs/taskqueue.md#prefetch)"
        ),
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="run every system this many times, in alternating order; the table gives medians",
    )
    parser.add_argument("--quick", action="store_true", help="a short smoke run (small counts)")
    parser.add_argument(
        "--only",
        action="append",
        choices=("lakeshore", "pgqueuer", "procrastinate", *LAKESHORES),
        help="run only this system (repeatable; 'lakeshore' is both stores)",
    )
    parser.add_argument(
        "--database-url",
        default=DEFAULT_DATABASE_URL,
        help="a PostgreSQL database to connect to for creating (and dropping) scratch ones",
    )
    parser.add_argument("--timeout", type=float, default=600, help="max seconds per drain")
    parser.add_argument(
        "--profile-dir",
        help="record the Lakeshore server and a daemon (with its children) with py-spy "
        "during drains",
    )
    parser.add_argument("--profile-rate", type=int, default=100, help="py-spy's samples a second")
    opts = parser.parse_args()
    if opts.rounds < 1:
        parser.error("--rounds must be at least 1")
    if opts.quick:
        opts.jobs, opts.batches, opts.single = 1_000, 2, 100
        opts.latency, opts.warm, opts.rounds = 20, 40, 1
    return opts


def selected(opts: argparse.Namespace) -> list[str]:
    if not opts.only:
        return list(SYSTEMS)
    chosen = set(opts.only)
    if "lakeshore" in chosen:
        chosen |= set(LAKESHORES)
    return [s for s in SYSTEMS if s in chosen]


def _interrupted(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def measure(system: str, opts: argparse.Namespace) -> dict[str, float]:
    if system == "pgqueuer":
        return run_peer(PgQueuerPeer(), opts)
    if system == "procrastinate":
        return run_peer(ProcrastinatePeer(), opts)
    return run_lakeshore(system, opts)


def main() -> int:
    opts = parse_args()
    RES.admin_url = opts.database_url
    signal.signal(signal.SIGTERM, _interrupted)
    signal.signal(signal.SIGHUP, _interrupted)
    rounds: dict[str, list[dict[str, float]]] = {}
    code = 0
    try:
        print(header(), flush=True)
        print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}", flush=True)
        systems = selected(opts)
        for n in range(opts.rounds):
            print(f"[enqueue, every system in turn, round {n + 1} of {opts.rounds}]", flush=True)
            started = time.perf_counter()
            enqueued = enqueue_in_turn(systems, opts)
            for system, figures in enqueued.items():
                shown = ", ".join(f"{k} {fmt(k, v)}" for k, v in figures.items())
                print(f"  {TITLES[system]}: {shown}", flush=True)
            print(f"  ({time.perf_counter() - started:.0f} s)", flush=True)
            order = systems if n % 2 == 0 else systems[::-1]
            for system in order:
                print(f"[{TITLES[system]}, round {n + 1} of {opts.rounds}]", flush=True)
                rounds.setdefault(system, []).append({**enqueued[system], **measure(system, opts)})
    except KeyboardInterrupt:
        print("\ninterrupted: stopping every process, dropping every database", file=sys.stderr)
        code = 130
    except BenchError as exc:
        print(f"\nfailed: {exc}", file=sys.stderr)
        code = 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut cleaning
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        RES.close()
    if rounds:
        complete = min(len(runs) for runs in rounds.values())
        results = {system: medians(runs[:complete]) for system, runs in rounds.items()}
        print(f"\nmedians over {complete} round(s)" if complete > 1 else "")
        print(table(results, opts))
        print(
            "\nratio = Lakeshore / peer: above 1 Lakeshore is faster on jobs/s rows,"
            " slower on ms and set-up rows"
        )
        if complete > 1:
            print("\neach round's ratios to PgQueuer, for the targets")
            print(round_table(rounds, complete))
        print(f"load average at the end: {load()}")
    return code


if __name__ == "__main__":
    sys.exit(main())
