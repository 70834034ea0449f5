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
the user sees it, prefetch included. Each wait is also told in its parts (every clock
is the machine's own, so they compare): the submit request's round trip (the client's);
sent → submitted (the client's clock before the call to the server's as the submit
read it, the invocation's ``created_at``: how long the request waited for the server);
submitted → leased (``created_at`` to ``started_at``, the clock of the claim that
leased it: how long the claim took to take it); leased → started (to the body's clock:
the answer's way back to the daemon and the wait there for a slot). The slowest probes
of a flood run are listed with their parts. The figures: B's p50 / p95 wait in each run, the
ratio p95 with A's flood (keys) / p95 alone (target ≤ 1.5), and the drain rate of each
flood run — A's invocations, from its first submit to the last one's end (its
``finished_at``, read from the run's database once the run is over: polling the server
while it drains would slow what is measured) — with keys / without keys (target ≥
0.9). A's drain alone is timed, not the run's: B's trickle takes ``--probes`` times
``--every-ms`` (8 s) whatever the drain, and a rate over the whole run would be bound by
it. B's probes are also told in three parts of the run:
sent while A's batches went in, while A's flood drained, and after it had. With
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
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
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


SLOWEST = 5  # probes of a flood run listed with their parts
PARTS = ("submit round trip", "sent -> submitted", "submitted -> leased", "leased -> started")


@dataclass(frozen=True)
class Probe:
    """One of B's invocations: its clocks, in seconds since the epoch (one machine)."""

    sent: float  # the client's, before the submit call
    answered: float  # the client's, once the submit was answered
    submitted: float  # the server's, as the submit read it (created_at)
    leased: float  # the server's, as the claim that leased it read it (started_at)
    began: float  # the function body's, as it started

    @property
    def wait_ms(self) -> float:
        return (self.began - self.sent) * 1000

    @property
    def parts_ms(self) -> tuple[float, float, float, float]:
        """The wait's parts, in the order of :data:`PARTS`."""
        return (
            (self.answered - self.sent) * 1000,
            (self.submitted - self.sent) * 1000,
            (self.leased - self.submitted) * 1000,
            (self.began - self.leased) * 1000,
        )


@dataclass
class Run:
    probes: list[Probe]
    total: int = 0  # A's flood
    elapsed_s: float = 0.0  # from A's first submit until the last of A's had ended
    started: float = 0.0  # the client's clock (time.time()) as A's flood began
    flooded_s: float = 0.0  # from then until A's last batch was answered

    @property
    def waits_ms(self) -> list[float]:
        return [p.wait_ms for p in self.probes]

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


@dataclass(frozen=True)
class Sent:
    id: str  # the invocation's
    sent: float
    answered: float


def flood_ended(db: str, flood: int) -> float:
    """When the last of A's ``flood`` no-ops ended (seconds since the epoch), read from
    the run's database once everything has ended."""
    with psycopg.connect(db) as conn:
        row = conn.execute(
            "SELECT count(*), max(finished_at) FROM invocations"
            " WHERE fn = %s AND state = 'succeeded'",
            (NOOP,),
        ).fetchone()
    if row is None or row[0] != flood or row[1] is None:
        raise BenchError(f"not {flood} of A's succeeded: {row}")
    ended: datetime = row[1]
    return ended.timestamp()


def trickle(
    http: httpx.Client, ledger: Path, probes: int, every_s: float, key: str | None
) -> dict[str, Sent]:
    """B's submits, one every ``every_s``: tag -> its id and the client's clocks."""
    sent: dict[str, Sent] = {}
    next_at = time.monotonic()
    for n in range(probes):
        tag = f"b{n}"
        body: dict[str, Any] = {"fn": STAMP, "args": [str(ledger), tag]}
        if key is not None:
            body["concurrency_key"] = key
        before = time.time()
        created = check(http.post(f"{NS}/queues/{QUEUE}/invocations", json=body), 201)
        sent[tag] = Sent(created["id"], before, time.time())
        next_at += every_s
        time.sleep(max(0.0, next_at - time.monotonic()))
    return sent


def _epoch(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def probes(http: httpx.Client, ledger: Path, sent: dict[str, Sent]) -> list[Probe]:
    """Each probe's clocks: the client's, its record's (``created_at``, ``started_at``),
    and its body's (the ledger)."""
    began: dict[str, float] = {}
    for line in ledger.read_text().splitlines():
        tag, at = line.split()
        began[tag] = float(at)
    missing = set(sent) - set(began)
    if missing:
        raise BenchError(f"{len(missing)} probes never started")
    found: list[Probe] = []
    for tag, s in sent.items():
        record = check(http.get(f"{NS}/invocations/{s.id}"), 200)
        submitted, leased = _epoch(record["created_at"]), _epoch(record["started_at"])
        found.append(Probe(s.sent, s.answered, submitted, leased, began[tag]))
    return found


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
                    run = _measure(http, url, token, ledger, opts, flood=flood, keyed=keyed)
                finally:
                    for daemon in daemons:
                        stop(daemon)
            if flood:
                run.elapsed_s = flood_ended(db, opts.flood) - run.started
            return run


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
    sent: dict[str, Sent] = {}
    b_key = "b" if keyed else None

    def b_side() -> None:
        with httpx.Client(base_url=url, headers=http.headers, timeout=60) as own:
            sent.update(trickle(own, ledger, opts.probes, opts.every_ms / 1000, b_key))

    started = time.perf_counter()
    started_at = time.time()
    b = threading.Thread(target=b_side)
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
    else:
        b.start()
    flooded_s = time.perf_counter() - started
    b.join()
    wait_until(http, before + opts.probes + (opts.flood if flood else 0), DONE_TIMEOUT_S)
    found = probes(http, ledger, sent)
    return Run(found, opts.flood if flood else 0, 0.0, started_at, flooded_s)


def report(label: str, run: Run, *, flood: bool) -> None:
    """A run's B waits and their parts (p50 / p95 each); a flood run's slowest probes."""
    p50, p95 = percentile(run.waits_ms, 50), percentile(run.waits_ms, 95)
    rate = f", drain {run.rate:,.0f} inv/s" if flood else ""
    print(f"  {label}: B wait p50 {p50:.1f} ms, p95 {p95:.1f} ms{rate}")
    _parts(run.probes)
    if not flood:
        return

    # while A's batches go in, the server that takes B's submit and the daemons' claims
    # also takes 1,000-row submits; after, only the drain is going on
    def sent_s(p: Probe) -> float:
        return p.sent - run.started

    phases = (
        ("while A's batches went in", [p for p in run.probes if sent_s(p) < run.flooded_s]),
        (
            "while A's flood drained",
            [p for p in run.probes if run.flooded_s <= sent_s(p) < run.elapsed_s],
        ),
        ("after A's flood", [p for p in run.probes if sent_s(p) >= run.elapsed_s]),
    )
    for name, some in phases:
        if some:
            waits = [p.wait_ms for p in some]
            p50, p95 = percentile(waits, 50), percentile(waits, 95)
            print(f"    {len(some)} probes sent {name}: wait p50 {p50:.1f} ms, p95 {p95:.1f} ms")
            _parts(some)
    print(
        f"    A's flood submitted in {run.flooded_s * 1000:,.0f} ms,"
        f" drained in {run.elapsed_s * 1000:,.0f} ms; the slowest probes:"
    )
    for p in sorted(run.probes, key=lambda p: p.wait_ms, reverse=True)[:SLOWEST]:
        parts = " + ".join(f"{v:.1f}" for v in p.parts_ms[1:])
        at = (p.sent - run.started) * 1000
        print(
            f"      {p.wait_ms:7.1f} ms = {parts} (submit trip {p.parts_ms[0]:.1f} ms)"
            f", sent at {at:,.0f} ms"
        )


def _parts(some: list[Probe]) -> None:
    for name, values in zip(PARTS, zip(*(p.parts_ms for p in some), strict=True), strict=True):
        p50, p95 = percentile(list(values), 50), percentile(list(values), 95)
        print(f"      {name:<20} p50 {p50:8.1f} ms, p95 {p95:8.1f} ms")


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
            report(f"round {n + 1}, {label}", run, flood=flood)
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
