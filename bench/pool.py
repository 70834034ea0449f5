"""Pool benchmark: what a pool child costs to start, and what an invocation costs in one.

Measured in this process with the daemon's imports loaded (``lakeshore.cli.main``), as
under ``lakeshore daemon run``:

Every invocation goes through the process runner (``runner.Processes.run``) on an event
loop, as the daemon runs it:

1. a new pool child (``python -m lakeshore.daemon.child``, exec'd) until it has run one
   no-op invocation, ``--starts`` times;
2. ``--invocations`` no-op invocations one after another through one warm child;
3. ``--invocations`` no-op invocations through ``--children`` warm children at once,
   with the CPU each side spends per invocation (this process, and the children's own
   from ``/proc``);
4. ``--invocations`` no-ops queued ahead to one child (``Child.serve`` in this process, on
   a socket pair): the child's own CPU per invocation when it never waits for the daemon,
   against what it spends in a drain, woken for each one;
5. for comparison, a child started by each of multiprocessing's start methods (``fork``,
   ``forkserver``, ``spawn``) running one no-op: ``fork`` is also what the daemon did per
   invocation before the pool.

Usage (from the repository root)::

    .venv/bin/python bench/pool.py [--invocations 1000] [--starts 20] [--children 8]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import resource
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import lakeshore.cli.main  # noqa: F401  (the daemon's imports, loaded as in a daemon)
from lakeshore.daemon import child, runner, wire
from lakeshore.daemon.runners import Invocation

NOOP = Invocation("noop", "tests.udfs:noop", [], {}, 30)


def _noop() -> None:
    return None


async def child_start(starts: int) -> list[float]:
    times = []
    for _ in range(starts):
        processes = runner.Processes()
        began = time.perf_counter()
        assert (await processes.run(NOOP)).ok
        times.append(time.perf_counter() - began)
        await processes.close()
    return times


async def through_one_child(invocations: int) -> float:
    processes = runner.Processes()
    try:
        assert (await processes.run(NOOP)).ok  # started and warm
        began = time.perf_counter()
        for _ in range(invocations):
            assert (await processes.run(NOOP)).ok
        return time.perf_counter() - began
    finally:
        await processes.close()


def child_loop(invocations: int) -> float:
    """A child's own CPU per no-op (µs), its messages queued ahead: what running an
    invocation costs a warm child when it never waits for the daemon (run in this
    process, on a socket pair, a thread reading what it sends)."""
    ours, theirs = socket.socketpair()

    def read() -> None:
        while ours.recv(1 << 16):
            pass

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    runs = [("run", str(n), NOOP.fn, [], {}, None) for n in range(invocations)]
    data = wire.pack_all([*runs, ("exit",)])
    threading.Thread(target=ours.sendall, args=(data,), daemon=True).start()
    one = child.Child(child.Channel(theirs.fileno()), [], rss=False)
    began = time.process_time()
    one.serve()
    spent = time.process_time() - began  # the reader thread's share included
    theirs.close()
    reader.join(5.0)
    ours.close()
    return spent * 1e6 / invocations


def _cpu_s(pids: list[int]) -> float:
    """User + system CPU of live processes, from ``/proc`` (they are not reaped yet)."""
    total = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


async def through_warm_children(invocations: int, children: int) -> tuple[float, float, float]:
    """Seconds, and CPU per invocation of this process and of the children (ms)."""
    processes = runner.Processes()
    pool = processes.pool
    processes.warm(children)
    assert await pool.warmed(60.0)
    slots = asyncio.Semaphore(children)

    async def one() -> None:
        async with slots:
            assert (await processes.run(NOOP)).ok

    try:
        await asyncio.gather(*(one() for _ in range(children)))  # each child has run it
        pids = pool.children
        children_before = _cpu_s(pids)
        ours_before = resource.getrusage(resource.RUSAGE_SELF)
        began = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(invocations)))
        elapsed = time.perf_counter() - began
        ours_after = resource.getrusage(resource.RUSAGE_SELF)
        ours = (ours_after.ru_utime + ours_after.ru_stime) - (
            ours_before.ru_utime + ours_before.ru_stime
        )
        theirs = _cpu_s(pids) - children_before
    finally:
        await processes.close()
    return elapsed, ours * 1000 / invocations, theirs * 1000 / invocations


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
    parser.add_argument("--children", type=int, default=8)
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, load {os.getloadavg()}")
    starts = asyncio.run(child_start(args.starts))
    print(f"pool child start + first no-op: median {_ms(statistics.median(starts))}")
    total = asyncio.run(through_one_child(args.invocations))
    each = total / args.invocations
    print(
        f"{args.invocations} no-ops through one warm child: {total:.2f} s, "
        f"{_ms(each)} each, {args.invocations / total:.0f}/s"
    )
    total, ours, theirs = asyncio.run(through_warm_children(args.invocations, args.children))
    print(
        f"{args.invocations} no-ops through {args.children} warm children on an event loop: "
        f"{args.invocations / total:.0f}/s, CPU per invocation {ours:.3f} ms in the daemon "
        f"+ {theirs:.3f} ms in the children"
    )
    loop_us = statistics.median(child_loop(args.invocations) for _ in range(3))
    print(
        f"{args.invocations} no-ops queued ahead to one child, in this process: "
        f"{loop_us:.1f} µs of CPU each (median of 3)"
    )
    for method in ("fork", "forkserver", "spawn"):
        times = multiprocessing_start(method, args.starts)
        print(f"multiprocessing {method} child, one no-op: median {_ms(statistics.median(times))}")


if __name__ == "__main__":
    main()
