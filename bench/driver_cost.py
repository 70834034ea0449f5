"""What one statement costs the process that sends it, by PostgreSQL driver.

A single submit is one statement on PostgreSQL (``store/statements.py``); its driver's
CPU is part of the server's. Here one process on uvloop, as the server runs, sends
``--statements`` prepared ``INSERT … RETURNING`` of one row each to a temporary table,
one after another on one connection, through psycopg's ``AsyncConnection`` (what the
store uses), psycopg's blocking ``Connection``, and asyncpg (when installed: it is a
requirement of the benchmarks, not of Lakeshore). It prints the CPU this process spent
per statement (the driver, its wait on the socket, and the kernel's side of the socket)
and the wall time per statement, for ``--rounds`` rounds.

Usage (from the repository root, after ``.venv/bin/pip install -r bench/requirements.txt``)::

    .venv/bin/python bench/driver_cost.py [--statements 5000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Awaitable, Callable

import psycopg
import uvloop
from peers import DEFAULT_DATABASE_URL, RES, database, load

TABLE = "CREATE TEMPORARY TABLE t (id text, body text)"
INSERT = "INSERT INTO t VALUES (%s, %s) RETURNING id"


async def timed(call: Callable[[], Awaitable[object]], count: int) -> tuple[float, float]:
    for _ in range(300):
        await call()
    cpu, started = time.process_time(), time.perf_counter()
    for _ in range(count):
        await call()
    wall = time.perf_counter() - started
    return (time.process_time() - cpu) / count * 1e6, wall / count * 1e6


async def round_of(dsn: str, count: int) -> dict[str, tuple[float, float]]:
    figures: dict[str, tuple[float, float]] = {}
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(TABLE)

        async def psycopg_async() -> object:
            return await (await conn.execute(INSERT, ("a", "b"), prepare=True)).fetchall()

        figures["psycopg AsyncConnection"] = await timed(psycopg_async, count)
    with psycopg.connect(dsn, autocommit=True) as blocking:
        blocking.execute(TABLE)

        async def psycopg_blocking() -> object:
            return blocking.execute(INSERT, ("a", "b"), prepare=True).fetchall()

        figures["psycopg Connection (blocking)"] = await timed(psycopg_blocking, count)
    try:
        asyncpg = importlib.import_module("asyncpg")
    except ImportError:
        print("asyncpg is not installed: its row is left out")
        return figures
    other = await asyncpg.connect(dsn)
    try:
        await other.execute(TABLE)
        prepared = await other.prepare("INSERT INTO t VALUES ($1, $2) RETURNING id")

        async def by_asyncpg() -> object:
            return await prepared.fetch("a", "b")

        figures["asyncpg"] = await timed(by_asyncpg, count)
    finally:
        await other.close()
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--statements", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    opts = parser.parse_args()
    RES.admin_url = opts.database_url
    print(f"load average at the start: {load()}", flush=True)
    try:
        with database() as dsn:
            for n in range(opts.rounds):
                print(f"\nround {n + 1} of {opts.rounds}, {opts.statements} statements a driver")
                print("| driver | CPU us/statement | wall us/statement |\n|---|---:|---:|")
                for name, (cpu, wall) in uvloop.run(round_of(dsn, opts.statements)).items():
                    print(f"| {name} | {cpu:.0f} | {wall:.0f} |", flush=True)
    finally:
        RES.close()
    print(f"\nload average at the end: {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
