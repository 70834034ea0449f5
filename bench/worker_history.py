"""What a worker runs now, asked of a worker with a long history, by index shape.

Finished invocations keep their ``worker_id``. A claim's view of what its worker holds, a
heartbeat's leases and a submit handed to a waiting claim each ask ``worker_id = ? AND
state = 'running'``. This times that question (a count, as a handed submit asks it) for a
worker that has finished ``--rows`` invocations and runs one, on SQLite and PostgreSQL,
with the index migration ``0008`` made (``(worker_id, state)``) and with the one it
replaced (``worker_id`` alone), in turn in the same run. The state is a bound parameter,
as most of those queries bind it; the handed submit's statement writes ``'running'`` into
its text, which lets PostgreSQL's planner take the partial index over running rows
(``ix_invocations_leases``) instead, so for that one statement on PostgreSQL the "before"
figure may be high.

Usage (from the repository root)::

    .venv/bin/python bench/worker_history.py [--rows 100000] [--asks 200] [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from peers import database
from sqlalchemy import Engine, create_engine, func, insert, pool, select, text

from lakeshore.store.engine import migrate, parse_url
from lakeshore.store.tables import invocations, namespaces, queues

NOW = datetime(2026, 1, 1, tzinfo=UTC)
SHAPES = {  # name: (index to drop, index to make)
    "(worker_id, state), 0008": (
        "ix_invocations_worker_id",
        "CREATE INDEX ix_invocations_worker_state ON invocations (worker_id, state)"
        " WHERE worker_id IS NOT NULL",
    ),
    "worker_id alone, before": (
        "ix_invocations_worker_state",
        "CREATE INDEX ix_invocations_worker_id ON invocations (worker_id)"
        " WHERE worker_id IS NOT NULL",
    ),
}


def stores(rows: int) -> Iterator[tuple[str, Engine]]:
    """Each store in turn, migrated and filled: SQLite on a scratch file, then PostgreSQL
    on a scratch database (both removed after)."""
    with tempfile.TemporaryDirectory(prefix="worker-history-") as tmp:
        yield from _filled("SQLite", f"sqlite:///{Path(tmp) / 'store.db'}", rows)
    with database() as url:
        yield from _filled("PostgreSQL", url, rows)


def _filled(name: str, url: str, rows: int) -> Iterator[tuple[str, Engine]]:
    migrate(parse_url(url))
    engine = create_engine(parse_url(url), poolclass=pool.NullPool)
    try:
        fill(engine, rows)
        yield name, engine
    finally:
        engine.dispose()


def fill(engine: Engine, rows: int) -> None:
    with engine.begin() as conn:
        conn.execute(insert(namespaces).values(id="ns_1", name="default", created_at=NOW))
        conn.execute(
            insert(queues).values(
                id="q_1",
                namespace_id="ns_1",
                name="q",
                kind="fifo",
                state="active",
                created_at=NOW,
                updated_at=NOW,
            )
        )
        # the worker's history and its one running invocation, then as many rows again
        # of other workers' (100 each, one of them running), so that no plan made
        # without the parameters' values takes ``worker_id = ?`` for most of the table
        total = 2 * rows + 1
        for start in range(0, total, 10_000):
            conn.execute(
                insert(invocations),
                [
                    {
                        "id": f"inv_{n:09d}",
                        "namespace_id": "ns_1",
                        "queue_id": "q_1",
                        "queue_name": "q",
                        "fn": "m:f",
                        "args": [],
                        "kwargs": {},
                        "state": "running" if n >= rows and (n - rows) % 100 == 0 else "succeeded",
                        "worker_id": "w_1" if n <= rows else f"w_other_{(n - rows - 1) // 100}",
                        "available_at": NOW,
                        "created_at": NOW,
                    }
                    for n in range(start, min(start + 10_000, total))
                ],
            )
    with engine.begin() as conn:
        conn.execute(text("ANALYZE"))


def shaped(engine: Engine, drop: str, make: str) -> None:
    with engine.begin() as conn:
        conn.execute(text(f"DROP INDEX IF EXISTS {drop}"))
        if make.split()[2] not in {
            row[0]
            for row in conn.execute(
                text("SELECT name FROM sqlite_master WHERE type = 'index'")
                if engine.dialect.name == "sqlite"
                else text("SELECT indexname FROM pg_indexes WHERE tablename = 'invocations'")
            )
        }:
            conn.execute(text(make))
        conn.execute(text("ANALYZE"))


def ask(engine: Engine, asks: int, generic: bool = False) -> float:
    """The median ms of one count of the worker's running invocations; ``generic``:
    on PostgreSQL, planned once for any parameters, as a statement prepared by the
    driver (psycopg, from its sixth run) may be."""
    query = select(func.count()).where(
        invocations.c.worker_id == "w_1", invocations.c.state == "running"
    )
    took = []
    with engine.connect() as conn:
        if generic:
            conn.execute(text("SET plan_cache_mode = force_generic_plan"))
        assert conn.execute(query).scalar_one() == 1
        for _ in range(asks):
            began = time.perf_counter()
            conn.execute(query).scalar_one()
            took.append((time.perf_counter() - began) * 1000)
    return statistics.median(took)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000, help="invocations the worker finished")
    parser.add_argument("--asks", type=int, default=200, help="questions timed per shape")
    parser.add_argument("--rounds", type=int, default=2, help="each shape this many times, in turn")
    opts = parser.parse_args(argv)
    print(f"a worker that finished {opts.rows:,} invocations and runs 1; median ms a question")
    print("| store | index | " + " | ".join(f"round {n + 1}" for n in range(opts.rounds)) + " |")
    print("|---|---|" + "---:|" * opts.rounds)
    for store, engine in stores(opts.rows):
        plans = [False, True] if engine.dialect.name == "postgresql" else [False]
        times: dict[str, list[float]] = {}
        for _ in range(opts.rounds):
            for shape, (drop, make) in SHAPES.items():
                shaped(engine, drop, make)
                for generic in plans:
                    name = f"{shape}, generic plan" if generic else shape
                    times.setdefault(name, []).append(ask(engine, opts.asks, generic))
        for shape, ms in times.items():
            print(f"| {store} | {shape} | " + " | ".join(f"{m:.3f}" for m in ms) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
