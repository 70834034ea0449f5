"""Fair turns between concurrency keys: one key's flood against another's trickle, on
PostgreSQL.

A real ``lakeshore server`` on a database of its own (127.0.0.1:5432, dropped at the
end) and ``--daemons`` long-polling daemons (``lakeshore daemon run --queue fair
--capacity C``, no other flag: their prefetch learned, as a user runs them; or with
``--prefetch N``) serve one fifo queue. Three runs, each on a fresh database and server:

1. **B alone**: key B submits one ``bench.peers_udf:stamp`` every ``--every-ms`` (100 ms),
   ``--probes`` times, to idle daemons;
2. **A's flood, with keys**: key A submits ``--flood`` (20,000) no-ops at once (batches of
   1,000, one request each), and B its trickle as it begins, each submit with its
   ``concurrency_key``; the claim takes turns between A and B;
3. **A's flood, without keys**: the same submits with no key (one fifo line).

B's wait is from the client's clock just before its submit call to the clock the
function body reads as it starts (it appends it to a ledger file): submit to start as
the user sees it, prefetch included. The figures: B's p50 / p95 wait in each run, the
ratio p95 with A's flood (keys) / p95 alone (target ≤ 1.5), and the drain rate of each
flood run — every invocation of the run, from A's first submit to the last success
(queue stats polled every 20 ms) — with keys / without keys (target ≥ 0.9). With
``--rounds N`` (default 3) the three runs go N times, the two floods' order reversed
every other round; the ratios are given round by round and as their medians.

Usage (from the repository root)::

    .venv/bin/python bench/fairness.py [--flood 20000] [--probes 80] [--daemons 2]

Every process it starts is stopped, and the database dropped, before it returns; every
wait is bounded.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from taskqueue import (
    LAKESHORE,
    NS,
    ROOT,
    BenchError,
    check,
    clean_env,
    machine,
    percentile,
    pg_database,
    running_server,
    stop,
)

QUEUE = "fair"
NOOP = "bench.peers_udf:noop"
STAMP = "bench.peers_udf:stamp"
BATCH = 1000
DONE_TIMEOUT_S = 600.0


@dataclass
class Run:
    waits_ms: list[float]
    total: int = 0
    elapsed_s: float = 0.0

    @property
    def rate(self) -> float:
        return self.total / self.elapsed_s if self.elapsed_s else 0.0


def start_daemon(
    url: str, token: str, log: Path, capacity: int, prefetch: int | None
) -> subprocess.Popen[bytes]:
    env = clean_env(LAKESHORE_URL=url, LAKESHORE_TOKEN=token, PYTHONPATH=str(ROOT))
    args = [str(LAKESHORE), "daemon", "run", "--queue", QUEUE, "--capacity", str(capacity)]
    if prefetch is not None:
        args += ["--prefetch", str(prefetch)]
    with log.open("ab") as out:
        return subprocess.Popen(
            args, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
        )


def succeeded(http: httpx.Client) -> int:
    return int(check(http.get(f"{NS}/queues/{QUEUE}/stats"), 200)["byState"]["succeeded"])


def wait_until(http: httpx.Client, count: int, timeout_s: float) -> float:
    """Poll until ``count`` invocations succeeded; the moment they had."""
    deadline = time.monotonic() + timeout_s
    while succeeded(http) < count:
        if time.monotonic() > deadline:
            raise BenchError(f"not {count} succeeded in {timeout_s:.0f} s")
        time.sleep(0.02)
    return time.perf_counter()


def trickle(
    http: httpx.Client, ledger: Path, probes: int, every_s: float, key: str | None
) -> dict[str, float]:
    """B's submits, one every ``every_s``: tag -> the client's clock before each."""
    sent: dict[str, float] = {}
    next_at = time.monotonic()
    for n in range(probes):
        tag = f"b{n}"
        body: dict[str, Any] = {"fn": STAMP, "args": [str(ledger), tag]}
        if key is not None:
            body["concurrency_key"] = key
        sent[tag] = time.time()
        check(http.post(f"{NS}/queues/{QUEUE}/invocations", json=body), 201)
        next_at += every_s
        time.sleep(max(0.0, next_at - time.monotonic()))
    return sent


def waits(ledger: Path, sent: dict[str, float]) -> list[float]:
    began: dict[str, float] = {}
    for line in ledger.read_text().splitlines():
        tag, at = line.split()
        began[tag] = float(at)
    missing = set(sent) - set(began)
    if missing:
        raise BenchError(f"{len(missing)} probes never started")
    return [(began[tag] - at) * 1000 for tag, at in sent.items()]


def one_run(opts: argparse.Namespace, *, flood: bool, keyed: bool) -> Run:
    with tempfile.TemporaryDirectory(prefix="lakeshore-fairness-") as tmp:
        workdir = Path(tmp)
        ledger = workdir / "ledger"
        with pg_database() as db, running_server(db, workdir) as (url, token):
            headers = {"Authorization": f"Bearer {token}"}
            with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
                check(http.post(f"{NS}/queues", json={"name": QUEUE, "kind": "fifo"}), 201)
                daemons = [
                    start_daemon(
                        url, token, workdir / f"daemon-{n}.log", opts.capacity, opts.prefetch
                    )
                    for n in range(opts.daemons)
                ]
                try:
                    return _measure(http, url, token, ledger, opts, flood=flood, keyed=keyed)
                finally:
                    for daemon in daemons:
                        stop(daemon)


def _measure(
    http: httpx.Client,
    url: str,
    token: str,
    ledger: Path,
    opts: argparse.Namespace,
    *,
    flood: bool,
    keyed: bool,
) -> Run:
    # warm: every daemon registered and its children up (one stamp each, then idle)
    for n in range(opts.daemons * 2):
        body = {"fn": STAMP, "args": [str(ledger.with_suffix(".warm")), f"w{n}"]}
        check(http.post(f"{NS}/queues/{QUEUE}/invocations", json=body), 201)
    wait_until(http, opts.daemons * 2, 60)
    time.sleep(0.5)  # the daemons back to long-polling
    before = succeeded(http)
    sent: dict[str, float] = {}
    b_key = "b" if keyed else None

    def b_side() -> None:
        with httpx.Client(base_url=url, headers=http.headers, timeout=60) as own:
            sent.update(trickle(own, ledger, opts.probes, opts.every_ms / 1000, b_key))

    started = time.perf_counter()
    b = threading.Thread(target=b_side)
    total = opts.probes
    if flood:
        item: dict[str, Any] = {"fn": NOOP}
        if keyed:
            item["concurrency_key"] = "a"
        first = [item] * min(BATCH, opts.flood)
        path = f"{NS}/queues/{QUEUE}/invocations/batch"
        check(http.post(path, json={"invocations": first}), 201)
        b.start()  # B's trickle begins as A's flood goes in
        for at in range(BATCH, opts.flood, BATCH):
            items = [item] * min(BATCH, opts.flood - at)
            check(http.post(path, json={"invocations": items}), 201)
        total += opts.flood
    else:
        b.start()
    b.join()
    done = wait_until(http, before + total, DONE_TIMEOUT_S)
    return Run(waits(ledger, sent), total, done - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flood", type=int, default=20_000, help="key A's invocations")
    parser.add_argument("--probes", type=int, default=80, help="key B's invocations")
    parser.add_argument("--every-ms", type=float, default=100, help="between B's submits")
    parser.add_argument("--daemons", type=int, default=2)
    parser.add_argument("--capacity", type=int, default=8, help="each daemon's --capacity")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the three runs")
    parser.add_argument(
        "--prefetch", type=int, default=None, help="each daemon's --prefetch (default: learned)"
    )
    opts = parser.parse_args()
    print(machine(), flush=True)
    print(
        f"flood {opts.flood:,}, B: {opts.probes} probes every {opts.every_ms:g} ms,"
        f" {opts.daemons} daemon(s) x {opts.capacity},"
        f" prefetch {'learned' if opts.prefetch is None else opts.prefetch}",
        flush=True,
    )
    labels = ("B alone (key b)", "A's flood, with keys", "A's flood, without keys")
    setups = dict(zip(labels, ((False, True), (True, True), (True, False)), strict=True))
    runs: dict[str, list[Run]] = {label: [] for label in labels}
    for n in range(opts.rounds):
        # the flood runs in turns, the order reversed every other round: a busy moment of
        # a shared machine falls on both alike
        order = [labels[0], *(labels[1:] if n % 2 == 0 else labels[:0:-1])]
        for label in order:
            flood, keyed = setups[label]
            run = one_run(opts, flood=flood, keyed=keyed)
            runs[label].append(run)
            p50, p95 = percentile(run.waits_ms, 50), percentile(run.waits_ms, 95)
            rate = f", drain {run.rate:,.0f} inv/s" if flood else ""
            print(f"  round {n + 1}, {label}: B wait p50 {p50:.1f} ms, p95 {p95:.1f} ms{rate}")
    alone, keyed_runs, plain = (runs[label] for label in labels)
    p95s = [percentile(r.waits_ms, 95) for r in alone]
    ratios = [percentile(k.waits_ms, 95) / p for k, p in zip(keyed_runs, p95s, strict=True)]
    drains = [k.rate / p.rate for k, p in zip(keyed_runs, plain, strict=True)]
    print()
    print("round by round:", ", ".join(f"{r:.2f}" for r in ratios), "|", end=" ")
    print(", ".join(f"{d:.2f}" for d in drains))
    wait = statistics.median(ratios)
    print(f"B's p95 wait, A's flood with keys / B alone (median): {wait:.2f} (target <= 1.5)")
    drain = statistics.median(drains)
    print(f"drain rate, with keys / without keys (median):        {drain:.2f} (target >= 0.9)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
