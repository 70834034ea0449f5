"""Dashboard and list benchmark at scale: a real ``lakeshore server`` whose store holds
``--rows`` invocations (a million by default) in one queue, per backend.

It fills the store directly (bulk inserts of rows shaped as the server writes them:
90 % succeeded, 5 % failed, 3 % pending, 2 % cancelled, one per millisecond), then times,
over HTTP with one keep-alive client, ``--requests`` requests of each of:

- ``GET …/queues/big/invocations?limit=50``: the API's first page, newest first;
- the same with ``state=failed``; the same with a cursor half-way down the list;
- the dashboard's queue page (``/ui/ns/default/queues/big``: summary, explain, decisions
  and the first 50 invocations), with and without ``state=failed``;
- the dashboard's queues page and an invocation's page.

and prints p50 / p95 / max in milliseconds (the target: p95 under 300 ms).

Usage (from the repository root)::

    .venv/bin/python bench/dashboard.py [--backend sqlite|postgresql|both] [--rows N]

Every process it starts is stopped before it returns.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from taskqueue import (
    NS,
    check,
    machine,
    percentile,
    pg_database,
    running_server,
)

from lakeshore.domain import cursors
from lakeshore.store.engine import parse_url
from lakeshore.store.tables import invocations, queues

QUEUE = "big"
CHUNK = 20_000
MIX = (("succeeded", 90), ("failed", 5), ("pending", 3), ("cancelled", 2))


def states(n: int) -> Iterator[str]:
    cycle = [state for state, share in MIX for _ in range(share)]
    for i in range(n):
        yield cycle[(i * 37) % len(cycle)]  # spread evenly, not in runs


def fill(db: str, rows: int) -> tuple[str, list[tuple[datetime, str]]]:
    """Insert ``rows`` invocations into the queue; returns one invocation id and the
    (created_at, id) of every 10,000th row, newest first (for cursors)."""
    url = parse_url(db)
    engine = sa.create_engine(url.set(drivername=url.drivername.split("+")[0]))
    marks: list[tuple[datetime, str]] = []
    start = datetime(2026, 1, 1, tzinfo=UTC)
    with engine.begin() as conn:
        queue_id, namespace_id = conn.execute(
            sa.select(queues.c.id, queues.c.namespace_id).where(queues.c.name == QUEUE)
        ).one()
    chunk: list[dict[str, object]] = []
    state_of = states(rows)
    began = time.monotonic()
    for i in range(rows):
        state = next(state_of)
        created = start + timedelta(milliseconds=i)
        finished = created + timedelta(seconds=1) if state not in ("pending",) else None
        row_id = f"inv_{i:020x}"
        chunk.append(
            {
                "id": row_id,
                "namespace_id": namespace_id,
                "queue_id": queue_id,
                "queue_name": QUEUE,
                "fn": "tests.udfs:square",
                "args": [i],
                "kwargs": {},
                "priority": 0.0,
                "key": None,
                "state": state,
                "attempts": 0 if state == "pending" else 1,
                "max_attempts": 1,
                "timeout_s": None,
                "worker_id": None,
                "lease_expires_at": None,
                "available_at": created,
                "result": i * i if state == "succeeded" else None,
                "error": {"type": "ValueError", "message": "bad", "traceback": "…"}
                if state == "failed"
                else None,
                "created_at": created,
                "started_at": created if finished else None,
                "finished_at": finished,
            }
        )
        if i % 10_000 == 0:
            marks.append((created, row_id))
        if len(chunk) == CHUNK:
            with engine.begin() as conn:
                conn.execute(invocations.insert(), chunk)
            chunk = []
            print(f"  {i + 1:,} rows ({time.monotonic() - began:.0f} s)", file=sys.stderr)
    if chunk:
        with engine.begin() as conn:
            conn.execute(invocations.insert(), chunk)
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text("ANALYZE invocations"))
    else:
        with engine.begin() as conn:
            conn.execute(sa.text("ANALYZE"))
    engine.dispose()
    return f"inv_{rows // 2:020x}", list(reversed(marks))


def timed(n: int, call: Callable[[], httpx.Response]) -> str:
    call()  # warm
    spent = []
    for _ in range(n):
        began = time.perf_counter()
        answer = call()
        spent.append((time.perf_counter() - began) * 1000)
        if answer.status_code != 200:
            raise SystemExit(f"{answer.request.url}: {answer.status_code} {answer.text[:300]}")
    return statistics_line(spent)


def statistics_line(ms: list[float]) -> str:
    return f"{percentile(ms, 50):7.1f} {percentile(ms, 95):7.1f} {max(ms):7.1f}"


def sign_in(url: str, token: str) -> httpx.Client:
    browser = httpx.Client(base_url=url, timeout=60)
    form = browser.get("/ui/login")
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', form.text)
    assert csrf
    signed = browser.post("/ui/login", data={"token": token, "csrf": csrf.group(1)})
    assert signed.status_code == 303, signed.text
    return browser


def measure(url: str, token: str, db: str, opts: argparse.Namespace) -> list[tuple[str, str]]:
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
        check(http.post(f"{NS}/queues", json={"name": QUEUE}), 201)
        print(f"filling {opts.rows:,} invocations …", file=sys.stderr)
        began = time.monotonic()
        one, marks = fill(db, opts.rows)
        print(f"filled in {time.monotonic() - began:.0f} s", file=sys.stderr)
        middle = marks[len(marks) // 2]
        cursor = cursors.issue(*middle)
        listing = f"{NS}/queues/{QUEUE}/invocations"
        n = opts.requests
        found = [
            ("API first page", timed(n, lambda: http.get(listing, params={"limit": 50}))),
            (
                "API state=failed",
                timed(n, lambda: http.get(listing, params={"limit": 50, "state": "failed"})),
            ),
            (
                "API half-way cursor",
                timed(n, lambda: http.get(listing, params={"limit": 50, "cursor": cursor})),
            ),
        ]
        with contextlib.closing(sign_in(url, token)) as browser:
            page = f"/ui/ns/default/queues/{QUEUE}"
            found += [
                ("UI queue page", timed(n, lambda: browser.get(page))),
                ("UI queue, state=failed", timed(n, lambda: browser.get(f"{page}?state=failed"))),
                ("UI queues page", timed(n, lambda: browser.get("/ui/ns/default/queues"))),
                (
                    "UI invocation page",
                    timed(n, lambda: browser.get(f"/ui/ns/default/invocations/{one}")),
                ),
            ]
    return found


def run_backend(backend: str, opts: argparse.Namespace) -> list[tuple[str, str]]:
    with tempfile.TemporaryDirectory(prefix=f"lakeshore-bench-ui-{backend}-") as tmp:
        workdir = Path(tmp)
        settings = {"ELASTICITY_ENABLED": "false"}
        if backend == "sqlite":
            db = f"sqlite:///{workdir / 'bench.db'}"
            with running_server(db, workdir, **settings) as (url, token):
                return measure(url, token, db, opts)
        with pg_database() as db, running_server(db, workdir, **settings) as (url, token):
            return measure(url, token, db, opts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=50)
    opts = parser.parse_args()
    backends = ["sqlite", "postgresql"] if opts.backend == "both" else [opts.backend]
    print(machine())
    print(f"rows: {opts.rows:,}; requests per line: {opts.requests}")
    for backend in backends:
        results = run_backend(backend, opts)
        print(f"\n{backend}: {'':26} p50 ms  p95 ms  max ms")
        for name, line in results:
            print(f"  {name:34} {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
