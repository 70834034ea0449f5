"""The Procrastinate app of ``bench/peers.py``.

Workers run ``procrastinate --app=bench.peers_procrastinate.app worker ...``; the benchmark
defers through the same tasks (``App.with_connector``). ``PsycopgConnector`` (its default,
async) on the database in ``PEERS_DSN``. Tasks are ``async def``, so a worker runs up to
``--concurrency`` of them at once on its event loop; they call the functions of
``bench/peers_udf.py``.
"""

from __future__ import annotations

import os

import procrastinate
from bench.peers_udf import noop, stamp

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(conninfo=os.environ.get("PEERS_DSN", ""))
)


@app.task(name="enqueue_noop", queue="enqueue")
async def enqueue_noop() -> None:
    noop()  # never run: the enqueue measures leave these queued


@app.task(name="drain_noop", queue="drain")
async def drain_noop() -> None:
    noop()


@app.task(name="stamp", queue="latency")
async def stamp_task(ledger: str, tag: str) -> None:
    stamp(ledger, tag)


@app.task(name="warm", queue="warm")
async def warm() -> None:
    from bench import peers_warm  # the set-up runs at the first import in this process

    peers_warm.work()
