"""A due delayed invocation on an idle daemon: from its due time to the start of its body,
per backend.

For SQLite and/or PostgreSQL (a fresh store each: a file in a temporary directory, or a
database of its own on 127.0.0.1:5432, dropped at the end) it starts a real
``lakeshore server`` and one idle, long-polling daemon (``lakeshore daemon run --queue
delays``, the repository root on its ``PYTHONPATH``), then submits ``--probes``
invocations one at a time, each with ``not_before`` a little ahead of now (0.3 to 0.5 s, at
random, so no probe lines up with a poll), of ``bench.peers_udf:stamp``, which appends
``TAG TIME`` (``time.time()`` as its body starts) to a ledger file. Each probe waits for
the previous one to succeed, so the daemon is idle, its claim waiting, when the next falls
due.

With ``not_before`` the due time is exact and known to the client: the figure is the
body's start minus that time (one machine, one clock), with no submit round trip in it.
A probe whose submit reached the server after its ``not_before`` (due at once, then: its
``created_at`` is past it) is counted apart and left out.

Prints, per store: the probes, min / p50 / p99 / max of (body start - due time) in ms, and
the load average when the store's run began (the target is p99 ≤ 1 s).

Usage (from the repository root)::

    .venv/bin/python bench/delays.py [--probes 200] [--only sqlite|postgresql]

Every process it starts is stopped before it returns; every wait is bounded.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
from taskqueue import (
    NS,
    BenchError,
    check,
    machine,
    parse_ts,
    percentile,
    pg_database,
    running_server,
    start_daemon,
    stop,
)

QUEUE = "delays"
FN = "bench.peers_udf:stamp"
LEAD_S = (0.3, 0.5)  # how far ahead of now each probe's not_before is
PROBE_TIMEOUT_S = 30.0
POLL_S = 0.002


@dataclass
class Result:
    backend: str
    lates_ms: list[float]  # body start - due time, one per probe
    early_submits: int  # probes whose submit reached the server after their due time
    load: tuple[float, float, float]


@contextmanager
def store(backend: str, tmp: Path) -> Iterator[str]:
    """The server's ``--db``: a fresh SQLite file, or a fresh PostgreSQL database."""
    if backend == "sqlite":
        yield str(tmp / "store.db")
    else:
        with pg_database() as url:
            yield url


def stamped(ledger: Path, tag: str) -> float | None:
    """The time ``tag``'s body began, once its line is in the ledger."""
    if not ledger.exists():
        return None
    for line in ledger.read_text().splitlines():
        got, _, when = line.partition(" ")
        if got == tag:
            return float(when)
    return None


def finish(http: httpx.Client, invocation_id: str) -> dict[str, object]:
    """Wait (bounded) for the invocation to succeed; its record."""
    deadline = time.monotonic() + PROBE_TIMEOUT_S
    while True:
        record: dict[str, object] = check(http.get(f"{NS}/invocations/{invocation_id}"), 200)
        if record["state"] == "succeeded":
            return record
        if record["state"] in ("failed", "cancelled", "expired"):
            raise BenchError(f"probe {invocation_id} ended {record['state']}: {record}")
        if time.monotonic() > deadline:
            raise BenchError(f"probe {invocation_id} not done in {PROBE_TIMEOUT_S:.0f} s")
        time.sleep(0.01)


def probe(http: httpx.Client, ledger: Path, tag: str) -> tuple[float, bool]:
    """One delayed submit: (body start - due time in ms, whether its submit reached the
    server before its due time)."""
    due = time.time() + random.uniform(*LEAD_S)
    body = {
        "fn": FN,
        "args": [str(ledger), tag],
        "not_before": datetime.fromtimestamp(due, UTC).isoformat(),
    }
    made = check(http.post(f"{NS}/queues/{QUEUE}/invocations", json=body), 201)
    deadline = time.monotonic() + PROBE_TIMEOUT_S
    while (began := stamped(ledger, tag)) is None:
        if time.monotonic() > deadline:
            raise BenchError(f"probe {tag} did not start in {PROBE_TIMEOUT_S:.0f} s")
        time.sleep(POLL_S)
    record = finish(http, str(made["id"]))
    in_time = parse_ts(str(record["created_at"])).timestamp() < due
    return (began - due) * 1000, in_time


def run_backend(backend: str, probes: int) -> Result:
    load = os.getloadavg()
    quiet = {"LAKESHORE_ELASTICITY_ENABLED": "false"}
    with (
        tempfile.TemporaryDirectory(prefix=f"lakeshore-delays-{backend}-") as tmp_name,
        store(backend, Path(tmp_name)) as db,
        running_server(db, Path(tmp_name), **quiet) as (url, token),
        httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60
        ) as http,
    ):
        tmp = Path(tmp_name)
        ledger = tmp / "ledger"
        # the queue exists before the daemon says hello; its first run imports the UDF
        warm = check(
            http.post(
                f"{NS}/queues/{QUEUE}/invocations", json={"fn": FN, "args": [str(ledger), "warm"]}
            ),
            201,
        )
        daemon = start_daemon(url, token, tmp / "daemon.log", QUEUE, burst=False)
        try:
            finish(http, str(warm["id"]))
            time.sleep(0.2)  # back to long-polling: the daemon is idle
            lates: list[float] = []
            early = 0
            for n in range(probes):
                if daemon.poll() is not None:
                    raise BenchError(f"the daemon exited {daemon.returncode}; see {tmp}")
                late_ms, in_time = probe(http, ledger, f"p{n}")
                if in_time:
                    lates.append(late_ms)
                else:
                    early += 1
        finally:
            stop(daemon)
    if not lates:
        raise BenchError(f"[{backend}] no probe reached the server before its due time")
    return Result(backend, lates, early, load)


def table(results: list[Result]) -> str:
    head = "| store | probes | min (ms) | p50 (ms) | p99 (ms) | max (ms) | load average at start |"
    lines = [head, "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in results:
        counted = f"{len(r.lates_ms)}" + (
            f" (+{r.early_submits} left out)" if r.early_submits else ""
        )
        lines.append(
            f"| {r.backend} | {counted} | {min(r.lates_ms):.1f} | {percentile(r.lates_ms, 50):.1f}"
            f" | {percentile(r.lates_ms, 99):.1f} | {max(r.lates_ms):.1f}"
            f" | {' / '.join(f'{x:.2f}' for x in r.load)} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--probes", type=int, default=200)
    parser.add_argument("--only", choices=["sqlite", "postgresql"])
    opts = parser.parse_args()
    if opts.probes < 1:
        parser.error("--probes must be at least 1")
    print(machine(), flush=True)
    results: list[Result] = []
    for backend in [opts.only] if opts.only else ["sqlite", "postgresql"]:
        try:
            result = run_backend(backend, opts.probes)
        except BenchError as exc:
            print(f"[{backend}] failed: {exc}", file=sys.stderr)
            return 1
        print(f"[{backend}] done: {len(result.lates_ms)} probes", flush=True)
        results.append(result)
    print("\nbody start - due time (not_before), idle long-polling daemon:")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
