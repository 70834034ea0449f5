"""What one request costs the client, by Python HTTP client, against a server that only
answers.

A single submit is one round trip, and the client's CPU is part of it. The server here is
the no-framework ASGI app of ``bench/floor_app.py`` (``FLOOR_MODE=noop``) under uvicorn
with httptools and uvloop, in a process of its own; one sequential client, one kept-alive
connection, ``--requests`` timed ``POST``s of a submit-shaped JSON body (after 300
untimed ones), each answer read and decoded. Clients: the SDK's own transport
(``lakeshore.transport``'s direct implementation: kept sockets, answers read by
httptools), the standard
library's ``http.client`` on one kept-alive connection (the SDK's transport before), a
urllib3 connection pool (before that; when urllib3 is installed), and httpx.
It prints requests per second and the client's CPU per request, for ``--rounds``
rounds.

Usage (from the repository root)::

    .venv/bin/python bench/client_cost.py [--requests 5000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import http.client
import importlib
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import orjson
from peers import BIN, clean_env, free_port, load

from lakeshore import transport

BENCH = Path(__file__).resolve().parent
BODY = orjson.dumps({"fn": "bench.peers_udf:noop", "args": [], "kwargs": {}})
HEADERS = {"Authorization": "Bearer -", "Content-Type": "application/json"}


def timed(call: Callable[[], object], count: int) -> tuple[float, float]:
    for _ in range(300):
        call()
    cpu, started = time.process_time(), time.perf_counter()
    for _ in range(count):
        call()
    elapsed = time.perf_counter() - started
    return count / elapsed, (time.process_time() - cpu) / count * 1e3


def clients(url: str) -> dict[str, Callable[[], object]]:
    own = transport.connect(url, timeout=30)
    client = httpx.Client(base_url=url, timeout=30)
    parts = url.removeprefix("http://").rsplit(":", 1)
    stdlib = http.client.HTTPConnection(parts[0], int(parts[1]), timeout=30)

    def stdlib_call() -> object:
        stdlib.request("POST", "/submit", body=BODY, headers=HEADERS)
        return orjson.loads(stdlib.getresponse().read())

    calls: dict[str, Callable[[], object]] = {
        "lakeshore.transport (httptools)": lambda: orjson.loads(
            own.request("POST", "/submit", body=BODY, headers=HEADERS).content
        ),
        "http.client, one kept-alive connection": stdlib_call,
    }
    try:  # urllib3 comes with the cloud extras, not with Lakeshore itself
        urllib3 = importlib.import_module("urllib3")
    except ImportError:
        print("urllib3 is not installed: its row is left out")
    else:
        pool = urllib3.connection_from_url(url, maxsize=10, timeout=urllib3.Timeout(total=30))
        calls["urllib3 pool"] = lambda: orjson.loads(
            pool.urlopen("POST", "/submit", body=BODY, headers=HEADERS).data
        )
    calls["httpx"] = lambda: orjson.loads(
        client.post("/submit", content=BODY, headers=HEADERS).content
    )
    return calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=5_000, help="timed requests a client")
    parser.add_argument("--rounds", type=int, default=2, help="every client, this many times")
    opts = parser.parse_args()
    print(f"load average at the start: {load()}", flush=True)
    port = free_port()
    args = [str(BIN / "uvicorn"), "floor_app:app", "--app-dir", str(BENCH)]
    args += ["--http", "httptools", "--loop", "auto", "--log-level", "warning"]
    args += ["--host", "127.0.0.1", "--port", str(port)]
    server = subprocess.Popen(args, env=clean_env(FLOOR_MODE="noop"))
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                httpx.get(f"{url}/healthz", timeout=1.0)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        for n in range(opts.rounds):
            print(f"\nround {n + 1} of {opts.rounds}, {opts.requests} requests a client")
            print("| client | requests/s | client CPU ms/request |\n|---|---:|---:|")
            for name, call in clients(url).items():
                rate, cpu_ms = timed(call, opts.requests)
                print(f"| {name} | {rate:,.0f} | {cpu_ms:.3f} |", flush=True)
    finally:
        server.terminate()
        server.wait(timeout=10)
    print(f"\nload average at the end: {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
