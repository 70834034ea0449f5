"""A daemon's sentinel: a small process that outlives the daemon, SIGKILL included, to
clean up after it: it kills the process groups of the daemon's pool children, and tells
the server what the daemon had begun, so that only that is charged an attempt and the
rest (work prefetched, waiting for a slot) goes back to the queue at once.

Each pool child leads a process group (a session) of its own, and whatever its UDFs start
joins it. The child kills the rest of its group as its invocations end, and the daemon
kills the whole group when the child ends; the child also dies with the daemon
(:func:`~lakeshore.daemon.linux.die_with_parent`), but its own children would not. So the
daemon tells the sentinel, in lines on its stdin:

- ``+pgid`` / ``-pgid``: a pool child's group is live / gone;
- ``worker {json}``: once registered, its worker id, server, token, session and lease;
- ``begin <id>``: an invocation is about to run — written before the run begins, so a
  UDF that kills the daemon at once (a poison pill) is still charged, and cannot come
  back forever; ``end <id>``: it is over and its outcome reported (sent with the next
  ``begin``: one write per invocation);
- ``exit``: the daemon exits on its own, having handed back what it held.

The kernel tells the sentinel when the daemon is gone (SIGTERM on the parent's death), and
so does the end of its stdin. It then reads what is still in the pipe, kills every live
group, reports the invocations begun and not ended (``POST /v1/workers/{id}/crashed``,
with the daemon's token; retried for up to a lease while the server cannot be reached),
and exits. It is started with ``exec`` (``python -m lakeshore.daemon.sentinel``), not
forked, so it holds none of the daemon's state; the HTTP client is imported only for the
report. It reads its stdin in bursts, at most ``READ_EVERY_S`` apart, so a daemon starting
thousands of invocations a second wakes it tens of times a second, not thousands.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Any

from lakeshore.daemon import linux

READ_EVERY_S = 0.02  # the most a burst of lines waits in the pipe
ENDS_HELD = 1000  # ends sent on their own once this many wait for a begin
PIPE_BYTES = 1 << 20  # Linux's default most for an unprivileged process
REPORT_FOR_S = 60.0  # the longest the report is retried (bounded by the lease)


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


class Sentinel:
    """The daemon's side: start it, ``add``/``discard`` each pool child's group, ``serve``
    once registered, ``begin``/``end`` each invocation it runs."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()  # groups are added from the runner threads
        self._ends: list[str] = []  # ended, not yet told

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
        if self._process.stdin is not None:  # room for what a burst of starts writes
            with contextlib.suppress(OSError, AttributeError):  # between two reads of it
                fcntl.fcntl(self._process.stdin.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)

    def _send(self, line: str) -> None:
        with self._lock:
            self._write(line + "\n")

    def _write(self, text: str) -> None:
        stdin: IO[bytes] | None = self._process.stdin if self._process else None
        if stdin is None:
            return
        with contextlib.suppress(OSError, ValueError):
            stdin.write(text.encode())
            stdin.flush()

    def add(self, pgid: int) -> None:
        self._send(f"+{pgid}")

    def discard(self, pgid: int) -> None:
        self._send(f"-{pgid}")

    def serve(self, *, server: str, token: str, worker: str, session: str, lease_s: float) -> None:
        """What the report of a crash needs: where, as whom, for which hello."""
        about = {"server": server, "token": token, "worker": worker, "session": session}
        self._send("worker " + json.dumps({**about, "lease_s": lease_s}))

    def begin(self, invocation_id: str) -> None:
        """``invocation_id`` is about to run: told before it does (one write, with the
        ends that waited for it)."""
        with self._lock:
            text = "".join(f"end {i}\n" for i in self._ends) + f"begin {invocation_id}\n"
            self._ends.clear()
            self._write(text)

    def end(self, invocation_id: str) -> None:
        """``invocation_id``'s run is over and its outcome reported (or lost): told with
        the next ``begin``."""
        with self._lock:
            self._ends.append(invocation_id)
            if len(self._ends) >= ENDS_HELD:
                self._flush()

    def claimed(self, invocation_ids: list[str]) -> None:
        """Claimed again: an end still untold for one of them is told now, so the new
        attempt is not taken for the one that ended, should the daemon die before it
        begins."""
        with self._lock:
            if self._ends and not set(self._ends).isdisjoint(invocation_ids):
                self._flush()

    def _flush(self) -> None:
        self._write("".join(f"end {i}\n" for i in self._ends))
        self._ends.clear()

    def stop(self, *, report: bool = False) -> None:
        """The daemon is exiting on its own: the sentinel exits too, killing nothing (with
        ``report``, as if the daemon had died: it did not hand back what it held)."""
        if self._process is None:
            return
        if not report:
            self._send("exit")
        with self._lock, contextlib.suppress(OSError):
            if self._process.stdin is not None:
                self._process.stdin.close()
        try:
            self._process.wait(15 if report else 5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process = None


class _Watch:
    """The sentinel's side: the live groups, the invocations begun, and what ends it."""

    def __init__(self) -> None:
        self.groups: set[int] = set()
        self.begun: set[str] = set()
        self.worker: dict[str, Any] | None = None
        self._partial = b""

    def feed(self, data: bytes) -> None:
        """Take the lines in ``data`` (a line cut at its end waits for the rest)."""
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        for raw in lines:
            self.take(raw.decode(errors="replace").strip())

    def take(self, line: str) -> None:
        if line == "exit":  # the daemon exits on its own, its groups already gone
            os._exit(0)
        verb, _, rest = line.partition(" ")
        if verb == "begin":
            self.begun.add(rest)
        elif verb == "end":
            self.begun.discard(rest)
        elif verb == "worker":
            with contextlib.suppress(ValueError):
                self.worker = json.loads(rest)
        with contextlib.suppress(ValueError):
            if line.startswith("+"):
                self.groups.add(int(line[1:]))
            elif line.startswith("-"):
                self.groups.discard(int(line[1:]))

    def take_waiting(self, fd: int) -> None:
        """What the daemon sent and is still unread, without blocking."""
        os.set_blocking(fd, False)
        with contextlib.suppress(OSError):
            while data := os.read(fd, 1 << 16):
                self.feed(data)

    def daemon_gone(self) -> None:
        """Kill every live group, report what had begun, and exit."""
        for pgid in list(self.groups):
            kill_group(pgid)
        with contextlib.suppress(Exception):  # the leases' expiry is the fallback
            self.report()
        os._exit(0)

    def report(self) -> None:
        if self.worker is None:  # it died before its hello: it held nothing
            return
        # only now: a sentinel whose daemon lives never needs it. The daemon's transport
        # (its certificates and the environment's proxies, read the same way)
        from lakeshore import transport

        worker, server = self.worker, str(self.worker["server"]).rstrip("/")
        path = f"/v1/workers/{worker['worker']}/crashed"
        body = {"started": sorted(self.begun), "session": worker["session"]}
        headers = {"Authorization": f"Bearer {worker['token']}"}
        until = time.monotonic() + min(REPORT_FOR_S, float(worker.get("lease_s") or 30.0))
        wait_s = 0.2
        with transport.connect(server, headers=headers, timeout=10.0) as http:
            while True:
                try:
                    answer = http.request("POST", path, json=body)
                    if answer.status_code != 429 and answer.status_code < 500:
                        _say(f"daemon of worker {worker['worker']} died: {answer.text}")
                        return
                except transport.Unreachable:
                    pass
                if time.monotonic() + wait_s > until:
                    _say("could not report the daemon's death; its leases will expire")
                    return
                time.sleep(wait_s)
                wait_s = min(5.0, wait_s * 2)


def _say(message: str) -> None:
    with contextlib.suppress(OSError):
        sys.stderr.write(f"lakeshore sentinel: {message}\n")
        sys.stderr.flush()


def main(argv: list[str]) -> None:
    parent = int(argv[1])
    watch = _Watch()
    # the parent's death (SIGTERM) wakes the wait below through this pipe: a signal
    # handler that did the work could cut a read short and lose what it had read
    woken, wake = os.pipe()
    os.set_blocking(wake, False)
    signal.set_wakeup_fd(wake)
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    linux.set_parent_death_signal(signal.SIGTERM)  # after the handler: no window without
    stdin = sys.stdin.fileno()
    if os.getppid() != parent:  # the daemon died as this started: act on what it sent
        watch.take_waiting(stdin)
        watch.daemon_gone()
    while True:
        ready = select.select([stdin, woken], [], [])[0]
        if woken in ready:
            break
        data = os.read(stdin, 1 << 16)
        if not data:  # stdin closed without a word: the daemon is gone
            break
        watch.feed(data)
        select.select([woken], [], [], READ_EVERY_S)  # let a burst gather, unless woken
    watch.take_waiting(stdin)
    watch.daemon_gone()


if __name__ == "__main__":
    main(sys.argv)
