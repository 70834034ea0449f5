"""What a daemon costs before its first invocation runs: a launched daemon's side of
scaling from zero.

One ``lakeshore server`` (SQLite, in a scratch folder). Each round submits one
invocation of ``bench.peers_udf:stamp`` to an idle queue, then starts ``lakeshore
daemon run --burst --capacity N`` on it and waits for the daemon to exit. Per round:

- **to first body**: from the daemon's exec to the invocation's body starting (its
  stamp): the interpreter and imports, the HTTP clients, hello, the pool's children
  started and warm, the claim, and the run;
- **CPU**: the daemon's and its children's user + system time over its whole life (one
  invocation, so nearly all of it is start-up and exit);
- **wall**: exec to exit.

It prints the median and the spread of each over ``--rounds``. No peer is run: this is
for comparing Lakeshore commits, one after another on the same machine.

Usage (from the repository root)::

    .venv/bin/python bench/daemon_start.py [--rounds 10] [--capacity 8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import (
    LAKESHORE,
    RES,
    STAMP_FN,
    BenchError,
    Lakeshore,
    Ledger,
    Run,
    children_cpu_s,
    clean_env,
    lakeshore_server,
    load,
)


def one_start(ls: Lakeshore, ledger: Ledger, n: int, capacity: int) -> tuple[float, float, float]:
    """(ms to the first body, CPU s of the daemon and its children, wall s to exit)."""
    tag = f"start{n}"
    ls.submit("start", STAMP_FN, [str(ledger.path), tag])
    env = clean_env(LAKESHORE_URL=ls.url, LAKESHORE_TOKEN=ls.token)
    args = [str(LAKESHORE), "daemon", "run", "--queue", "start", "--capacity", str(capacity)]
    cpu_before = children_cpu_s()
    started = time.time()
    proc = RES.start([*args, "--burst"], ls.run.log(f"daemon-{n}"), env)
    body = ledger.wait(tag)
    code = proc.wait(timeout=60)
    ended = time.time()
    if code != 0:
        raise BenchError(f"daemon {n} exited {code}")
    return (body - started) * 1000, children_cpu_s() - cpu_before, ended - started


def spread(values: list[float], unit: str, digits: int) -> str:
    return (
        f"median {statistics.median(values):.{digits}f} {unit} "
        f"(min {min(values):.{digits}f}, max {max(values):.{digits}f})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10, help="daemon starts to time")
    parser.add_argument("--capacity", type=int, default=8, help="--capacity of each daemon")
    opts = parser.parse_args()
    print(f"load average at start: {load()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="lakeshore-start-") as tmp:
        workdir = Path(tmp)
        run = Run("lakeshore-sqlite", opts, workdir)
        with lakeshore_server(f"sqlite:///{workdir / 'lakeshore.db'}", run) as ls:
            ledger = Ledger(workdir / "start.ledger")
            one_start(ls, ledger, -1, opts.capacity)  # warm-up: the queue, the disk cache
            firsts, cpus, walls = [], [], []
            for n in range(opts.rounds):
                first, cpu, wall = one_start(ls, ledger, n, opts.capacity)
                firsts.append(first)
                cpus.append(cpu * 1000)
                walls.append(wall * 1000)
    print(f"{opts.rounds} daemon starts, --capacity {opts.capacity}, pid {os.getpid()}:")
    print(f"  exec → first body: {spread(firsts, 'ms', 0)}")
    print(f"  CPU, daemon + children, start to exit: {spread(cpus, 'ms', 0)}")
    print(f"  wall, exec → exit: {spread(walls, 'ms', 0)}")
    print(f"load average at the end: {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
