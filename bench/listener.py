"""What hearing one wake-up costs a server: its listener's CPU per notification.

Every replica LISTENs for the others' wake-ups (``lakeshore.store.wakeups``), and a
single submit is one notification. Here one process LISTENs on uvloop, as the server
does, while another sends ``--notifications`` NOTIFYs one statement at a time; the
listening process's CPU is divided by the notifications it heard. Two ways of hearing
them: psycopg's ``AsyncConnection.notifies()`` (the listener before), and the
listener's own reader on the connection's socket (``wakeups._heard``).

Usage (from the repository root)::

    .venv/bin/python bench/listener.py [--notifications 20000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

import psycopg
import uvloop
from peers import DEFAULT_DATABASE_URL, RES, database, load

from lakeshore.store import wakeups

CHANNEL = "bench_listener"
SENDER = """
import sys, psycopg
with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    for _ in range(int(sys.argv[2])):
        conn.execute("SELECT pg_notify(%s, 'q_0123456789abcdef')", (sys.argv[3],))
"""


async def heard(dsn: str, way: str, count: int) -> float:
    """The listener's CPU per notification (microseconds)."""
    got = 0
    done = asyncio.Event()

    def deliver(keys: list[str]) -> None:
        nonlocal got
        got += 1
        if got == count:
            done.set()

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(f"LISTEN {CHANNEL}")

        async def by_notifies() -> None:
            async for notice in conn.notifies():
                deliver(notice.payload.split(" "))

        ways: dict[str, Callable[[], Coroutine[Any, Any, None]]] = {
            "notifies()": by_notifies,
            "own reader": lambda: wakeups._heard(conn, deliver),
        }
        task = asyncio.create_task(ways[way]())
        cpu = time.process_time()
        sender = await asyncio.create_subprocess_exec(
            sys.executable, "-c", SENDER, dsn, str(count), CHANNEL
        )
        try:
            await asyncio.wait_for(done.wait(), timeout=300)
            spent = time.process_time() - cpu
        finally:
            await asyncio.wait_for(sender.wait(), timeout=60)
            task.cancel()
    return spent / count * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--notifications", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    opts = parser.parse_args()
    RES.admin_url = opts.database_url
    print(f"load average at the start: {load()}", flush=True)
    print("| round | psycopg notifies() (us/notification) | own reader (us/notification) |")
    print("|---|---:|---:|")
    try:
        with database() as dsn:
            for n in range(opts.rounds):
                old = uvloop.run(heard(dsn, "notifies()", opts.notifications))
                new = uvloop.run(heard(dsn, "own reader", opts.notifications))
                print(f"| {n + 1} | {old:.1f} | {new:.1f} |", flush=True)
    finally:
        RES.close()
    print(f"\nload average at the end: {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
