"""A single submit's CPU in the application itself: no HTTP server, no client.

``create_app`` is started (its lifespan run) on a fresh database of each store, with no
reaper and no controller, and called directly as an ASGI application with a prepared
``POST /v1/namespaces/default/queues/single/invocations`` (the admin token, a JSON body,
its length): ``--warmup`` untimed calls (the first reads the queue; the next ones take
the fast path, as a user's repeated submits do), then ``--submits`` timed ones, one
after another on uvloop. It prints the process's CPU and the wall time per submit.
With ``--batch N`` each call is instead a batch of N invocations (``POST
…/invocations/batch?answer=ids``, as the SDK's ``submit_many`` sends them, each with
one argument), and the figures are per batch. Run
it at two commits in turn (``git checkout <commit> -- src/``) to compare what a change
to the submit's path costs the server, without the HTTP stack's and the machine's noise
around it.

Usage (from the repository root, after ``.venv/bin/pip install -r bench/requirements.txt``)::

    .venv/bin/python bench/submit_app.py [--submits 3000] [--rounds 1] [--only sqlite|postgresql]
    .venv/bin/python bench/submit_app.py --batch 1000 --submits 30 --warmup 3
"""

from __future__ import annotations

import argparse
import secrets
import sys
import tempfile
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import uvloop
from asgi_lifespan import LifespanManager
from peers import DEFAULT_DATABASE_URL, RES, load

from lakeshore.api.app import create_app
from lakeshore.config import Settings

PATH = "/v1/namespaces/default/queues/single/invocations"
BODY = b'{"fn":"bench.peers_udf:noop","args":[],"kwargs":{}}'
ITEM = b'{"fn":"bench.peers_udf:noop","args":[1],"kwargs":{}}'


async def measure(
    database_url: str, data_dir: Path, submits: int, warmup: int, batch: int = 0
) -> tuple[float, float]:
    """CPU and wall time per submit, in microseconds."""
    token = secrets.token_urlsafe(24)
    settings = Settings(
        database_url=database_url,
        admin_token=token,
        data_dir=data_dir,
        reaper_interval_s=0,
        elasticity_enabled=False,
    )
    app = create_app(settings)
    path, body, query = PATH, BODY, b""
    if batch:
        path, query = f"{PATH}/batch", b"answer=ids"
        body = b'{"invocations":[%b]}' % b",".join([ITEM] * batch)
    headers = [
        (b"host", b"bench"),
        (b"authorization", f"Bearer {token}".encode()),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query,
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    statuses: set[int] = set()

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.add(message["status"])

    async with LifespanManager(app):
        for _ in range(warmup):
            await app(dict(scope), receive, send)
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(submits):
            await app(dict(scope), receive, send)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    if statuses != {201}:
        raise SystemExit(f"the submits were answered {sorted(statuses)}, not only 201")
    return cpu / submits * 1e6, wall / submits * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--submits", type=int, default=3_000, help="timed submits per store")
    parser.add_argument("--warmup", type=int, default=300, help="untimed submits first")
    parser.add_argument("--rounds", type=int, default=1, help="each store, this many times")
    parser.add_argument("--only", choices=("sqlite", "postgresql"))
    parser.add_argument(
        "--batch", type=int, default=0, help="invocations a call (0: single submits)"
    )
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    opts = parser.parse_args()
    RES.admin_url = opts.database_url
    stores = [opts.only] if opts.only else ["sqlite", "postgresql"]
    print(f"load average at the start: {load()}", flush=True)
    call = f"batch of {opts.batch}" if opts.batch else "submit"
    print(f"| round | store | CPU µs/{call} | wall µs/{call} |\n|---:|---|---:|---:|", flush=True)
    try:
        for n in range(opts.rounds):
            for store in stores:
                with tempfile.TemporaryDirectory(prefix="lakeshore-submit-app-") as tmp:
                    if store == "postgresql":
                        url = RES.create_database()
                    else:
                        url = f"sqlite:///{tmp}/lakeshore.db"
                    try:
                        cpu, wall = uvloop.run(
                            measure(url, Path(tmp), opts.submits, opts.warmup, opts.batch)
                        )
                    finally:
                        if store == "postgresql":
                            RES.drop_database(url)
                print(f"| {n + 1} | {store} | {cpu:.0f} | {wall:.0f} |", flush=True)
    finally:
        RES.close()
    print(f"load average at the end: {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
