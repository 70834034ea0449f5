"""A ``lakeshore server``'s memory over bursts of concurrent long-poll claims.

A real server process (SQLite or PostgreSQL, a fresh store each); ``--workers`` workers
say hello to one empty queue, then each burst sends one ``POST /v1/workers/{id}/claim``
per worker at once (``timeout_s`` ``--wait-s``, each on a connection of its own, as
daemons do), all of which wait for work that never comes and are answered empty; the
connections are then closed. The server's RSS (psutil) is read before the first burst,
at its peak (sampled every 20 ms) and ``--settle-s`` after each burst, and the CPU time
the server spent on each burst (user + system, from the burst's start to the end of its
settle: the claims and whatever the server does once they end).

Usage (from the repository root)::

    .venv/bin/python bench/longpoll_memory.py [--only sqlite|postgresql] [--workers 500]
        [--bursts 3] [--wait-s 2] [--settle-s 5] [--env NAME=VALUE ...] [--log-level debug]

``--env`` sets a variable of the server's environment (``PYTHONMALLOC=malloc``, …).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psutil
import psycopg

ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
LAKESHORE = Path(sys.executable).parent / "lakeshore"
MB = 1024 * 1024


@contextmanager
def database(backend: str, workdir: Path) -> Iterator[str]:
    if backend == "sqlite":
        yield f"sqlite:///{workdir / 'store.db'}"
        return
    name = f"lakeshore_longpoll_{secrets.token_hex(4)}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def server(
    db: str, workdir: Path, env: dict[str, str], log_level: str = "warning"
) -> Iterator[tuple[str, str, int]]:
    port = free_port()
    args = [str(LAKESHORE), "server", "--host", "127.0.0.1", "--port", str(port)]
    args += ["--db", db, "--data-dir", str(workdir / "data"), "--log-level", log_level]
    log = (workdir / "server.log").open("ab")
    process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180  # slow under PYTHONTRACEMALLOC
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        token = (workdir / "data" / "admin-token").read_text().strip()
        yield url, token, process.pid
    finally:
        process.terminate()
        process.wait(30)
        log.close()


class Peak:
    """The highest RSS of a process while the block runs."""

    def __init__(self, pid: int) -> None:
        self.process, self.rss, self._done = psutil.Process(pid), 0, threading.Event()

    def __enter__(self) -> Peak:
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._done.wait(0.02):
            self.rss = max(self.rss, self.process.memory_info().rss)


def new_lines(path: Path, logger: str, seen: dict[Path, int] = {}) -> list[str]:  # noqa: B006
    """The lines of the server's log from ``logger`` written since the last call."""
    text = path.read_text(errors="replace")
    start, seen[path] = seen.get(path, 0), len(text)
    return [line for line in text[start:].splitlines() if logger in line]


def cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


async def burst(url: str, token: str, workers: list[str], wait_s: float) -> int:
    """One claim per worker at once, each on its own connection; how many were answered."""
    limits = httpx.Limits(max_connections=len(workers) + 10, max_keepalive_connections=0)
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(
        base_url=url, headers=headers, limits=limits, timeout=wait_s + 60
    ) as http:
        answers = await asyncio.gather(
            *(
                http.post(f"/v1/workers/{w}/claim", json={"timeout_s": wait_s, "max": 1})
                for w in workers
            )
        )
    return sum(a.status_code == 200 for a in answers)


async def measure(backend: str, opts: argparse.Namespace) -> None:
    env = {**os.environ, **dict(e.split("=", 1) for e in opts.env)}
    with (
        tempfile.TemporaryDirectory() as tmp,
        database(backend, Path(tmp)) as db,
        server(db, Path(tmp), env, opts.log_level) as (url, token, pid),
    ):
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as http:
            made = await http.post("/v1/namespaces/default/queues", json={"name": "idle"})
            assert made.status_code == 201, made.text
            hello = {"queues": ["idle"], "capabilities": {"max_invocations": 1}}
            workers = [
                (await http.post("/v1/workers/hello", json=hello)).json()["id"]
                for _ in range(opts.workers)
            ]
        process = psutil.Process(pid)
        if opts.warm:  # the same claims, a few at once: every first use done before
            await burst(url, token, workers[: opts.warm], opts.wait_s)
        await asyncio.sleep(opts.settle_s)
        before = process.memory_info().rss
        print(f"{backend}: {opts.workers} workers, RSS before {before / MB:.1f} MB", flush=True)
        for n in range(1, opts.bursts + 1):
            cpu = cpu_s(process)
            with Peak(pid) as peak:
                answered = await burst(url, token, workers, opts.wait_s)
            await asyncio.sleep(opts.settle_s)
            after = process.memory_info().rss
            spent = cpu_s(process) - cpu
            for line in new_lines(Path(tmp) / "server.log", "lakeshore.memory"):
                print(f"  | {line}", flush=True)
            print(
                f"  burst {n}: {answered} answered; peak {peak.rss / MB:.1f} MB "
                f"(+{(peak.rss - before) / MB:.1f}), {opts.settle_s:.0f} s after "
                f"{after / MB:.1f} MB (+{(after - before) / MB:.1f}); server CPU "
                f"{spent:.2f} s ({spent / len(workers) * 1e3:.2f} ms a claim)",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=["sqlite", "postgresql"])
    parser.add_argument("--workers", type=int, default=500)
    parser.add_argument("--bursts", type=int, default=3)
    parser.add_argument("--wait-s", type=float, default=2.0)
    parser.add_argument("--settle-s", type=float, default=5.0)
    parser.add_argument(
        "--warm", type=int, default=0, metavar="N", help="a burst of N claims first, not measured"
    )
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument(
        "--log-level",
        default="warning",
        help="the server's; at debug, its memory releases are shown after each burst",
    )
    opts = parser.parse_args()
    for backend in [opts.only] if opts.only else ["sqlite", "postgresql"]:
        asyncio.run(measure(backend, opts))


if __name__ == "__main__":
    main()
