"""How fast one HTTP submit can be on this machine, beside PgQueuer's single enqueue.

In one run, on fresh PostgreSQL databases, ``--single`` sequential calls (after
``--warmup`` untimed ones) of:

1. PgQueuer's ``Queries.enqueue`` of one job (asyncpg, straight to PostgreSQL);
2. an ASGI app with no framework under the server Lakeshore runs (uvicorn, httptools,
   uvloop), answering at once (``bench/floor_app.py``, ``FLOOR_MODE=noop``);
3. the same app writing each body with one autocommit ``INSERT`` (``FLOOR_MODE=insert``);
4. Lakeshore's single submit (``lakeshore server``, a queue already submitted to).

The three HTTP rows go through the SDK's own transport (``Client.request``, http.client with
kept-alive connections), so their difference is the server's. It prints each row's
calls per second, its ratio to PgQueuer's, and the CPU the server and the client spent
per call: rows 2 and 3 are the floor under any submit over HTTP from Python here.

Usage (from the repository root, after ``.venv/bin/pip install -r bench/requirements.txt``)::

    .venv/bin/python bench/submit_floor.py [--single 2000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from peers import BIN, DEFAULT_DATABASE_URL, RES, PgQueuerPeer, clean_env, free_port, load

from lakeshore.sdk import Client

BENCH = Path(__file__).resolve().parent
STARTUP_TIMEOUT_S = 30.0


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def serving(args: list[str], env: dict[str, str], log: Path) -> Iterator[tuple[str, int]]:
    port = free_port()
    proc = RES.start([*args, "--host", "127.0.0.1", "--port", str(port)], log, env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"{args[0]} exited {proc.returncode}; see {log}")
            try:
                httpx.get(f"{url}/healthz", timeout=1.0)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise SystemExit(
                        f"{args[0]} did not answer in {STARTUP_TIMEOUT_S:.0f}s"
                    ) from None
                time.sleep(0.1)
        yield url, proc.pid
    finally:
        RES.stop(proc)


def timed(call: Callable[[], object], count: int, warmup: int, pid: int | None) -> dict[str, float]:
    for _ in range(warmup):
        call()
    server = cpu_s(pid) if pid else 0.0
    client = time.process_time()
    started = time.perf_counter()
    for _ in range(count):
        call()
    elapsed = time.perf_counter() - started
    figures = {"rate": count / elapsed, "client_ms": (time.process_time() - client) / count * 1e3}
    if pid:
        figures["server_ms"] = (cpu_s(pid) - server) / count * 1e3
    return figures


def pgqueuer(dsn: str, count: int, warmup: int) -> dict[str, float]:
    async def run() -> dict[str, float]:
        peer = PgQueuerPeer()
        await peer.install(dsn)
        connection, queries = await peer._queries(dsn)
        try:
            for _ in range(warmup):
                await queries.enqueue("enqueue", None)
            started = time.perf_counter()
            for _ in range(count):
                await queries.enqueue("enqueue", None)
            return {"rate": count / (time.perf_counter() - started)}
        finally:
            await connection.close()

    return asyncio.run(run())


def floor(mode: str, dsn: str, count: int, warmup: int, workdir: Path) -> dict[str, float]:
    args = [str(BIN / "uvicorn"), "floor_app:app", "--app-dir", str(BENCH)]
    args += ["--http", "httptools", "--loop", "auto", "--log-level", "warning"]
    env = clean_env(FLOOR_MODE=mode, FLOOR_DATABASE_URL=dsn)
    with serving(args, env, workdir / f"floor-{mode}.log") as (url, pid), Client(url, "-") as sdk:
        body = {"fn": "bench.peers_udf:noop", "args": [], "kwargs": {}}
        return timed(lambda: sdk.request("POST", "/submit", json=body), count, warmup, pid)


def lakeshore(dsn: str, count: int, warmup: int, workdir: Path) -> dict[str, float]:
    token = secrets.token_urlsafe(24)
    args = [str(BIN / "lakeshore"), "server", "--db", dsn, "--log-level", "warning"]
    args += ["--data-dir", str(workdir / "data")]
    env = clean_env(LAKESHORE_ADMIN_TOKEN=token)
    with serving(args, env, workdir / "lakeshore.log") as (url, pid), Client(url, token) as sdk:
        return timed(lambda: sdk.submit("single", "bench.peers_udf:noop"), count, warmup, pid)


ROWS = (
    ("pgqueuer", "PgQueuer, Queries.enqueue of one job"),
    ("noop", "HTTP, no framework, answers at once"),
    ("insert", "HTTP, no framework, one INSERT"),
    ("lakeshore", "Lakeshore single submit (PostgreSQL)"),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--single", type=int, default=2_000, help="timed calls per row")
    parser.add_argument("--warmup", type=int, default=200, help="untimed calls first")
    parser.add_argument("--rounds", type=int, default=1, help="the four rows, this many times")
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    opts = parser.parse_args()
    RES.admin_url = opts.database_url
    print(f"load average at the start: {load()}", flush=True)
    try:
        with tempfile.TemporaryDirectory(prefix="lakeshore-floor-") as tmp:
            for n in range(opts.rounds):
                results: dict[str, dict[str, float]] = {}
                for key, _ in ROWS:
                    dsn = RES.create_database()
                    try:
                        if key == "pgqueuer":
                            results[key] = pgqueuer(dsn, opts.single, opts.warmup)
                        elif key == "lakeshore":
                            results[key] = lakeshore(dsn, opts.single, opts.warmup, Path(tmp))
                        else:
                            results[key] = floor(key, dsn, opts.single, opts.warmup, Path(tmp))
                    finally:
                        RES.drop_database(dsn)
                print(f"\nround {n + 1} of {opts.rounds}, {opts.single} calls a row")
                print(table(results))
    finally:
        RES.close()
    print(f"\nload average at the end: {load()}")
    return 0


def table(results: dict[str, dict[str, float]]) -> str:
    base = results["pgqueuer"]["rate"]
    lines = [
        "| call | calls/s | ÷ PgQueuer | server CPU ms/call | client CPU ms/call |",
        "|---|---:|---:|---:|---:|",
    ]
    for key, title in ROWS:
        row = results[key]
        server = f"{row['server_ms']:.3f}" if "server_ms" in row else "—"
        client = f"{row['client_ms']:.3f}" if "client_ms" in row else "—"
        lines.append(
            f"| {title} | {row['rate']:,.0f} | {row['rate'] / base:.2f}x | {server} | {client} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
