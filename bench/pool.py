"""Pool benchmark: what a pool child costs to start, and what an invocation costs in one.

Measured in this process with the daemon's imports loaded (``lakeshore.cli.main``), as
under ``lakeshore daemon run``:

1. a new pool child (``python -m lakeshore.daemon.child``, exec'd) until it has run one
   no-op invocation, ``--starts`` times;
2. ``--invocations`` no-op invocations one after another through one warm child;
3. for comparison, a child started by each of multiprocessing's start methods (``fork``,
   ``forkserver``, ``spawn``) running one no-op: ``fork`` is also what the daemon did per
   invocation before the pool.

Usage (from the repository root)::

    .venv/bin/python bench/pool.py [--invocations 1000] [--starts 20]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import lakeshore.cli.main  # noqa: F401  (the daemon's imports, loaded as in a daemon)
from lakeshore.daemon import runner
from lakeshore.daemon.pool import Pool

NOOP = "tests.udfs:noop"


def _noop() -> None:
    return None


def child_start(starts: int) -> list[float]:
    times = []
    for _ in range(starts):
        pool = Pool()
        began = time.perf_counter()
        assert runner.run(NOOP, [], {}, 30, pool=pool).ok
        times.append(time.perf_counter() - began)
        pool.close()
    return times


def through_one_child(invocations: int) -> float:
    pool = Pool()
    try:
        assert runner.run(NOOP, [], {}, 30, pool=pool).ok  # started and warm
        began = time.perf_counter()
        for _ in range(invocations):
            assert runner.run(NOOP, [], {}, 30, pool=pool).ok
        return time.perf_counter() - began
    finally:
        pool.close()


def multiprocessing_start(method: str, starts: int) -> list[float]:
    context = multiprocessing.get_context(method)
    times = []
    for _ in range(starts):
        began = time.perf_counter()
        process = context.Process(target=_noop)
        process.start()
        process.join(60)
        times.append(time.perf_counter() - began)
    return times


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--invocations", type=int, default=1000)
    parser.add_argument("--starts", type=int, default=20)
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, load {os.getloadavg()}")
    starts = child_start(args.starts)
    print(f"pool child start + first no-op: median {_ms(statistics.median(starts))}")
    total = through_one_child(args.invocations)
    each = total / args.invocations
    print(
        f"{args.invocations} no-ops through one warm child: {total:.2f} s, "
        f"{_ms(each)} each, {args.invocations / total:.0f}/s"
    )
    for method in ("fork", "forkserver", "spawn"):
        times = multiprocessing_start(method, args.starts)
        print(f"multiprocessing {method} child, one no-op: median {_ms(statistics.median(times))}")


if __name__ == "__main__":
    main()
