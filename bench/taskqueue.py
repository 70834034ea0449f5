"""Task-queue benchmark: a real ``lakeshore server`` and real daemons, per backend.

Measures, for SQLite and/or PostgreSQL:

1. submit rate, one invocation per request over one keep-alive connection;
2. submit rate, batches of ``--batch-size`` invocations per request;
3. claim -> run -> complete rate with 1 and with 4 ``--burst`` daemons draining a
   pre-filled queue of no-op invocations (wall time from daemon start to all exited);
4. the same with ``--heavy`` invocations of a function whose module imports a heavy
   library (``tests/udfs_heavy.py``), one daemon without and one with ``--preload``;
5. submit-to-start latency on an idle (long-polling) daemon: ``started_at - created_at``
   from the invocation record, one invocation at a time.

Usage (from the repository root)::

    .venv/bin/python bench/taskqueue.py [--backend sqlite|postgresql|both]

Every process it starts is stopped before it returns; every wait is bounded.
"""

from __future__ import annotations

import argparse
import os
import platform
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg

ROOT = Path(__file__).resolve().parents[1]
LAKESHORE = Path(sys.executable).parent / "lakeshore"
if not LAKESHORE.exists():
    LAKESHORE = ROOT / ".venv" / "bin" / "lakeshore"
NS = "/v1/namespaces/default"
NOOP = {"fn": "tests.udfs:noop"}
HEAVY_MODULE = "tests.udfs_heavy"  # imports kubernetes.client at module level
HEAVY = {"fn": f"{HEAVY_MODULE}:api_version"}
PG_SERVER = "postgresql://postgres@127.0.0.1:5432/test"
STARTUP_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0


class BenchError(Exception):
    pass


# --- processes ---------------------------------------------------------------------------


def clean_env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKESHORE_")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(overrides)
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, a bounded wait, then SIGKILL."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=STOP_TIMEOUT_S)


@contextmanager
def running_server(db: str, workdir: Path, **settings: str) -> Iterator[tuple[str, str]]:
    """A server for the block (``settings``: more environment, e.g.
    ``ELASTICITY_ENABLED="true"``); yields (url, admin token)."""
    token = secrets.token_urlsafe(24)
    env = clean_env(LAKESHORE_ADMIN_TOKEN=token, **settings)
    log_path = workdir / "server.log"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = [str(LAKESHORE), "server", "--host", "127.0.0.1", "--port", str(port)]
    args += ["--db", db, "--data-dir", str(workdir / "data"), "--log-level", "warning"]
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env
        )
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if process.poll() is not None:
                raise BenchError(f"server exited {process.returncode}:\n{log_path.read_text()}")
            try:
                if httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise BenchError(f"server not healthy in {STARTUP_TIMEOUT_S:.0f}s")
            time.sleep(0.1)
        yield url, token
    finally:
        stop(process)


def start_daemon(
    url: str, token: str, log: Path, queue: str, *, burst: bool, extra: tuple[str, ...] = ()
) -> subprocess.Popen[bytes]:
    env = clean_env(LAKESHORE_URL=url, LAKESHORE_TOKEN=token, PYTHONPATH=str(ROOT))
    args = [str(LAKESHORE), "daemon", "run", "--queue", queue, "--capacity", "4", *extra]
    if burst:
        args.append("--burst")
    with log.open("ab") as out:
        return subprocess.Popen(
            args, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
        )


@contextmanager
def pg_database() -> Iterator[str]:
    name = f"lakeshore_bench_{secrets.token_hex(4)}"
    with psycopg.connect(PG_SERVER, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield PG_SERVER.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with psycopg.connect(PG_SERVER, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --- measurements ------------------------------------------------------------------------


def check(response: httpx.Response, *codes: int) -> Any:
    if response.status_code not in codes:
        raise BenchError(f"{response.request.url}: {response.status_code} {response.text[:300]}")
    return response.json()


def submit_batches(
    http: httpx.Client, queue: str, total: int, size: int, item: dict[str, Any] = NOOP
) -> None:
    for start in range(0, total, size):
        items = [item] * min(size, total - start)
        check(http.post(f"{NS}/queues/{queue}/invocations/batch", json={"invocations": items}), 201)


def bench_submit_single(http: httpx.Client, queue: str, n: int) -> float:
    check(http.post(f"{NS}/queues/{queue}/invocations", json=NOOP), 201)  # warm-up, creates queue
    started = time.perf_counter()
    for _ in range(n):
        check(http.post(f"{NS}/queues/{queue}/invocations", json=NOOP), 201)
    return n / (time.perf_counter() - started)


def bench_submit_batch(http: httpx.Client, queue: str, batches: int, size: int) -> float:
    submit_batches(http, queue, size, size)  # warm-up
    started = time.perf_counter()
    submit_batches(http, queue, batches * size, size)
    return batches * size / (time.perf_counter() - started)


def bench_drain(
    http: httpx.Client,
    url: str,
    token: str,
    workdir: Path,
    queue: str,
    m: int,
    daemons: int,
    batch_size: int,
    timeout_s: float,
    item: dict[str, Any] = NOOP,
    extra: tuple[str, ...] = (),
) -> float:
    submit_batches(http, queue, m, batch_size, item)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        started = time.perf_counter()
        for n in range(daemons):
            log = workdir / f"{queue}-daemon-{n}.log"
            procs.append(start_daemon(url, token, log, queue, burst=True, extra=extra))
        deadline = time.monotonic() + timeout_s
        for proc in procs:
            code = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            if code != 0:
                raise BenchError(f"daemon exited {code}; see {workdir}")
        elapsed = time.perf_counter() - started
    finally:
        for proc in procs:
            stop(proc)
    stats = check(http.get(f"{NS}/queues/{queue}/stats"), 200)
    if stats["byState"]["succeeded"] != m:
        raise BenchError(f"{queue}: expected {m} succeeded, stats say {stats['byState']}")
    return m / elapsed


def parse_ts(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def bench_latency(
    http: httpx.Client, url: str, token: str, workdir: Path, queue: str, k: int
) -> list[float]:
    # Create the queue first so the daemon's hello names an existing queue.
    check(http.post(f"{NS}/queues/{queue}/invocations", json=NOOP), 201)
    daemon = start_daemon(url, token, workdir / f"{queue}-daemon.log", queue, burst=False)
    latencies: list[float] = []
    try:
        deadline = time.monotonic() + 60
        while check(http.get(f"{NS}/queues/{queue}/stats"), 200)["byState"]["succeeded"] < 1:
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"latency daemon did not start; see {workdir}")
            time.sleep(0.05)
        time.sleep(0.2)  # let it go back to long-polling: the worker is idle
        for _ in range(k):
            created = check(http.post(f"{NS}/queues/{queue}/invocations", json=NOOP), 201)
            path = f"{NS}/invocations/{created['id']}"
            deadline = time.monotonic() + 30
            while True:
                record = check(http.get(path), 200)
                if record["state"] == "succeeded":
                    break
                if record["state"] in ("failed", "cancelled", "expired"):
                    raise BenchError(f"latency probe ended {record['state']}: {record}")
                if time.monotonic() > deadline:
                    raise BenchError(f"latency probe not done in 30s: {record}")
                time.sleep(0.002)
            started_at = parse_ts(record["started_at"])
            created_at = parse_ts(record["created_at"])
            latencies.append((started_at - created_at).total_seconds() * 1000)
    finally:
        stop(daemon)
    return latencies


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))
    return ordered[index]


def run_backend(backend: str, opts: argparse.Namespace) -> dict[str, str]:
    with tempfile.TemporaryDirectory(prefix=f"lakeshore-bench-{backend}-") as tmp:
        workdir = Path(tmp)
        if backend == "sqlite":
            with running_server(str(workdir / "bench.db"), workdir) as (url, token):
                return measure(url, token, workdir, opts)
        with pg_database() as db, running_server(db, workdir) as (url, token):
            return measure(url, token, workdir, opts)


def measure(url: str, token: str, workdir: Path, opts: argparse.Namespace) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {token}"}
    results: dict[str, str] = {}
    with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
        rate = bench_submit_single(http, "submit-single", opts.single)
        results["submit, single (inv/s)"] = f"{rate:,.0f}"
        print(f"  submit single: {rate:,.0f}/s", flush=True)
        rate = bench_submit_batch(http, "submit-batch", opts.batches, opts.batch_size)
        results[f"submit, batch of {opts.batch_size} (inv/s)"] = f"{rate:,.0f}"
        print(f"  submit batch:  {rate:,.0f}/s", flush=True)
        for daemons in (1, 4):
            rate = bench_drain(
                http,
                url,
                token,
                workdir,
                f"drain-{daemons}",
                opts.drain,
                daemons,
                opts.batch_size,
                opts.timeout,
            )
            results[f"claim->complete, {daemons} daemon(s) x4 (inv/s)"] = f"{rate:,.0f}"
            print(f"  drain {daemons} daemon(s): {rate:,.0f}/s", flush=True)
        for extra in ((), ("--preload", HEAVY_MODULE)):
            rate = bench_drain(
                http,
                url,
                token,
                workdir,
                f"heavy-{len(extra)}",
                opts.heavy,
                1,
                opts.batch_size,
                opts.timeout,
                item=HEAVY,
                extra=extra,
            )
            label = "with --preload" if extra else "no preload"
            results[f"heavy import, 1 daemon x4, {label} (inv/s)"] = f"{rate:,.1f}"
            print(f"  heavy import, {label}: {rate:,.1f}/s", flush=True)
        lat = bench_latency(http, url, token, workdir, "latency", opts.latency)
        p50, p99 = percentile(lat, 50), percentile(lat, 99)
        results["submit->start p50 (ms)"] = f"{p50:.1f}"
        results["submit->start p99 (ms)"] = f"{p99:.1f}"
        print(f"  latency p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {max(lat):.1f} ms", flush=True)
        results["submit->start mean (ms)"] = f"{statistics.fmean(lat):.1f}"
    return results


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("sqlite", "postgresql", "both"), default="both")
    parser.add_argument("--single", type=int, default=500, help="sequential single submits")
    parser.add_argument("--batches", type=int, default=10, help="batch submits")
    parser.add_argument("--batch-size", type=int, default=500, help="invocations per batch")
    parser.add_argument("--drain", type=int, default=1000, help="invocations per drain run")
    parser.add_argument("--latency", type=int, default=100, help="latency probes")
    parser.add_argument(
        "--heavy", type=int, default=100, help="invocations of a heavy-import function per run"
    )
    parser.add_argument("--timeout", type=float, default=300, help="max seconds per drain run")
    opts = parser.parse_args()

    print(machine(), flush=True)
    backends = ["sqlite", "postgresql"] if opts.backend == "both" else [opts.backend]
    table: dict[str, dict[str, str]] = {}
    for backend in backends:
        print(f"[{backend}]", flush=True)
        table[backend] = run_backend(backend, opts)

    rows = list(next(iter(table.values())))
    width = max(len(r) for r in rows)
    print()
    print(f"| {'measure':<{width}} | " + " | ".join(f"{b:>10}" for b in backends) + " |")
    print(f"|{'-' * (width + 2)}|" + "|".join("-" * 11 + ":" for _ in backends) + "|")
    for row in rows:
        cells = " | ".join(f"{table[b][row]:>10}" for b in backends)
        print(f"| {row:<{width}} | {cells} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
