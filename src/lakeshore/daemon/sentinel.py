"""A daemon's sentinel: a small process that kills the process groups of the daemon's pool
children when the daemon dies, SIGKILL included.

Each pool child leads a process group (a session) of its own, and whatever its UDFs start
joins it. The child kills the rest of its group as its invocations end, and the daemon
kills the whole group when the child ends; the child also dies with the daemon
(:func:`~lakeshore.daemon.linux.die_with_parent`), but its own children would not, so
the daemon tells the sentinel which groups are live (``+pgid`` / ``-pgid``
lines on its stdin), and the kernel tells the sentinel when the daemon is gone (SIGTERM on
the parent's death): it then kills every live group and exits. It is started with ``exec``
(``python -m lakeshore.daemon.sentinel``), not forked, so it holds none of the daemon's
state, and idles in a blocking read, where a signal is handled at once.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
from typing import IO, Any

from lakeshore.daemon import linux


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


class Sentinel:
    """The daemon's side: start it, then ``add``/``discard`` each pool child's group."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()  # groups are added from the runner threads

    def start(self) -> None:
        """Start the sentinel (Linux only: elsewhere the kernel cannot tell it)."""
        if not sys.platform.startswith("linux"):
            return
        self._process = subprocess.Popen(
            [sys.executable, "-m", "lakeshore.daemon.sentinel", str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C at the terminal is for the daemon
        )

    def _send(self, line: str) -> None:
        with self._lock:
            stdin: IO[bytes] | None = self._process.stdin if self._process else None
            if stdin is None:
                return
            with contextlib.suppress(OSError, ValueError):
                stdin.write(line.encode() + b"\n")
                stdin.flush()

    def add(self, pgid: int) -> None:
        self._send(f"+{pgid}")

    def discard(self, pgid: int) -> None:
        self._send(f"-{pgid}")

    def stop(self) -> None:
        """The daemon is exiting on its own: the sentinel exits too, killing nothing."""
        if self._process is None:
            return
        self._send("exit")
        with self._lock, contextlib.suppress(OSError):
            if self._process.stdin is not None:
                self._process.stdin.close()
        try:
            self._process.wait(5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process = None


class _Watch:
    """The sentinel's side: the live groups, and what ends it."""

    def __init__(self) -> None:
        self.groups: set[int] = set()

    def kill_all(self, *_: Any) -> None:
        for pgid in list(self.groups):
            kill_group(pgid)
        os._exit(0)

    def take(self, line: str) -> None:
        if line == "exit":  # the daemon exits on its own, its groups already gone
            os._exit(0)
        with contextlib.suppress(ValueError):
            if line.startswith("+"):
                self.groups.add(int(line[1:]))
            elif line.startswith("-"):
                self.groups.discard(int(line[1:]))

    def take_waiting(self) -> None:
        """What the daemon sent and is still unread, without blocking."""
        while select.select([sys.stdin], [], [], 0)[0]:
            raw = sys.stdin.readline()
            if not raw:
                return
            self.take(raw.strip())


def main(argv: list[str]) -> None:
    parent = int(argv[1])
    watch = _Watch()
    signal.signal(signal.SIGTERM, watch.kill_all)  # before the request: no window without
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    linux.set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != parent:  # the daemon died as this started: act on what it sent
        watch.take_waiting()
        watch.kill_all()
    for raw in sys.stdin:
        watch.take(raw.strip())
    watch.kill_all()  # stdin closed without a word: the daemon is gone


if __name__ == "__main__":
    main(sys.argv)
