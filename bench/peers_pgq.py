"""The PgQueuer worker of ``bench/peers.py``:
``python -m bench.peers_pgq MODE BATCH_SIZE``.

It runs ``pgqueuer.run(create, mode=..., batch_size=...)``, what ``pgq run
bench.peers_pgq:create --mode MODE --batch-size N`` does (``max_concurrent_tasks`` left
at its default, no limit: PgQueuer refuses one under twice the batch size), on uvloop as
``pgq run`` does
(``pgq run`` itself fails at start in this environment: its ``--log-level`` parser hands
the logging set-up a string where it expects an enum).

One asyncpg connection to the database in ``PEERS_DSN`` (PgQueuer's first-choice driver),
a ``PgQueuer`` with one entrypoint per workload. Handlers are ``async def``, as PgQueuer's
users write them; they call the functions of ``bench/peers_udf.py``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import pgqueuer
import uvloop
from bench.peers_udf import noop, stamp
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job
from pgqueuer.types import QueueExecutionMode


@asynccontextmanager
async def create() -> AsyncIterator[PgQueuer]:
    connection = await asyncpg.connect(os.environ["PEERS_DSN"])
    try:
        pgq = PgQueuer(AsyncpgDriver(connection))

        @pgq.entrypoint("noop")
        async def run_noop(job: Job) -> None:
            noop()

        @pgq.entrypoint("stamp")
        async def run_stamp(job: Job) -> None:
            ledger, tag = (job.payload or b"").decode().split("\n", 1)
            stamp(ledger, tag)

        @pgq.entrypoint("warm")
        async def run_warm(job: Job) -> None:
            from bench import peers_warm  # the set-up runs at the first import in this process

            peers_warm.work()

        yield pgq
    finally:
        await connection.close()


def main() -> None:
    mode, batch_size = sys.argv[1], int(sys.argv[2])
    uvloop.run(pgqueuer.run(create, mode=QueueExecutionMode(mode), batch_size=batch_size))


if __name__ == "__main__":
    main()
