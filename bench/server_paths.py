"""The server's hot paths, in-process: where a request's time goes, without the network.

For SQLite and PostgreSQL (a fresh database each), against ``create_app`` through
httpx's ASGI transport (the client's own cost included, the sockets' not):

1. single submit: ``--single`` sequential ``POST …/invocations``;
2. batch submit: ``--batches`` requests of 1,000, answered with ids (as the SDK asks);
3. a busy daemon's cycle: ``POST /v1/workers/{id}/results`` with 250 outcomes and
   ``claim: 250``, until ``--jobs`` invocations are done;
4. wake-up: a waiting long-poll claim answered after a submit, ``--wakes`` times: from
   the submit's call to the claim's answer.

Each line gives the wall time and the process's CPU time per operation (per job for the
cycle). ``--profile DIR`` writes a pyinstrument profile of each measure there (pyinstrument
is not a requirement of the project: ``.venv/bin/pip install pyinstrument``).

Usage (from the repository root)::

    .venv/bin/python bench/server_paths.py [--only sqlite|postgresql] [--profile DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import httpx
import psycopg
from asgi_lifespan import LifespanManager

from lakeshore.api.app import create_app
from lakeshore.config import Settings

ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
TOKEN = "bench-server-paths-token"
NS = "/v1/namespaces/default"
CYCLE = 250


@contextmanager
def database(backend: str, workdir: Path) -> Iterator[str]:
    if backend == "sqlite":
        yield f"sqlite:///{workdir / 'store.db'}"
        return
    name = f"lakeshore_paths_{secrets.token_hex(4)}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


@asynccontextmanager
async def api(url: str, workdir: Path) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(
        database_url=url,
        data_dir=workdir / "data",
        admin_token=TOKEN,
        reaper_interval_s=0,
        elasticity_enabled=False,
    )
    app = create_app(settings)
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://t", headers=headers
        ) as c:
            yield c


def profiled(directory: Path | None, name: str) -> AbstractContextManager[Any]:
    if directory is None:
        return nullcontext()
    import pyinstrument

    @contextmanager
    def run() -> Iterator[None]:
        profiler = pyinstrument.Profiler(interval=0.0005, async_mode="enabled")
        profiler.start()
        try:
            yield
        finally:
            profiler.stop()
            directory.mkdir(parents=True, exist_ok=True)
            (directory / f"{name}.txt").write_text(profiler.output_text(unicode=True))

    return run()


async def timed(
    label: str, count: int, step: Callable[[], Awaitable[int]], directory: Path | None
) -> None:
    """Run ``step`` until it has done ``count`` (it returns how many it did); print the
    wall and CPU time per one."""
    with profiled(directory, label.split(":")[-1].strip().replace(" ", "-")):
        wall, cpu, done = time.perf_counter(), time.process_time(), 0
        while done < count:
            did = await step()
            if did == 0:
                break
            done += did
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(
        f"  {label:34s} {done / wall:9,.0f}/s  wall {wall / done * 1000:6.3f} ms  "
        f"CPU {cpu / done * 1000:6.3f} ms  (n={done})"
    )


def ok(response: httpx.Response, code: int = 200) -> Any:
    if response.status_code != code:
        raise SystemExit(f"{response.request.url}: {response.status_code} {response.text[:300]}")
    return response.json()


async def measure(backend: str, opts: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp, database(backend, Path(tmp)) as url:
        async with api(url, Path(tmp)) as c:
            print(f"[{backend}]")
            submit = f"{NS}/queues/single/invocations"
            ok(await c.post(submit, json={"fn": "m:f"}), 201)

            async def one() -> int:
                ok(await c.post(submit, json={"fn": "m:f"}), 201)
                return 1

            await timed("single submit", opts.single, one, opts.profile)
            batch = {"invocations": [{"fn": "m:f"}] * 1000}
            ok(await c.post(f"{NS}/queues/batch/invocations/batch", json=batch), 201)

            async def thousand() -> int:
                ok(await c.post(f"{NS}/queues/batch/invocations/batch?answer=ids", json=batch), 201)
                return 1000

            await timed(
                "batch submit (per invocation)", opts.batches * 1000, thousand, opts.profile
            )
            for _ in range(0, opts.jobs, 1000):
                ok(await c.post(f"{NS}/queues/cycle/invocations/batch", json=batch), 201)
            hello = {"queues": ["cycle"], "capabilities": {"max_invocations": 8, "prefetch": CYCLE}}
            worker = ok(await c.post("/v1/workers/hello", json=hello))["id"]
            claim = {"max": CYCLE, "timeout_s": 0}
            held = ok(await c.post(f"/v1/workers/{worker}/claim", json=claim))["invocations"]

            async def cycle() -> int:
                nonlocal held
                results = [{"id": i["id"], "result": None} for i in held]
                answer = await c.post(
                    f"/v1/workers/{worker}/results", json={"results": results, "claim": CYCLE}
                )
                done, held = len(held), ok(answer)["invocations"]
                return done

            await timed("results + claim (per job)", opts.jobs, cycle, opts.profile)
            await wakes(c, opts)


async def wakes(c: httpx.AsyncClient, opts: argparse.Namespace) -> None:
    hello = {"queues": ["wake"], "capabilities": {"max_invocations": 1}}
    worker = ok(await c.post("/v1/workers/hello", json=hello))["id"]
    waited: list[float] = []
    with profiled(opts.profile, "wake"):
        for _ in range(opts.wakes):
            poll = asyncio.create_task(
                c.post(f"/v1/workers/{worker}/claim", json={"timeout_s": 5, "max": 1})
            )
            await asyncio.sleep(0.05)  # the claim has looked, found nothing, and waits
            began = time.perf_counter()
            ok(await c.post(f"{NS}/queues/wake/invocations", json={"fn": "m:f"}), 201)
            [got] = ok(await poll)["invocations"]
            waited.append((time.perf_counter() - began) * 1000)
            results = {"results": [{"id": got["id"], "result": None}]}
            ok(await c.post(f"/v1/workers/{worker}/results", json=results))
    waited.sort()
    p99 = waited[min(len(waited) - 1, int(len(waited) * 0.99))]
    print(
        f"  {'submit -> waiting claim answered':34s} p50 {statistics.median(waited):.2f} ms  "
        f"p99 {p99:.2f} ms  (n={len(waited)})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=("sqlite", "postgresql"), action="append")
    parser.add_argument("--single", type=int, default=1000, help="single submits")
    parser.add_argument("--batches", type=int, default=10, help="batch submits of 1,000")
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs through the cycle")
    parser.add_argument("--wakes", type=int, default=200, help="wake-up probes")
    parser.add_argument("--profile", type=Path, help="write pyinstrument profiles here")
    opts = parser.parse_args()
    for backend in opts.only or ("sqlite", "postgresql"):
        asyncio.run(measure(backend, opts))


if __name__ == "__main__":
    main()
