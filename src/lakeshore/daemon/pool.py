"""The daemon's warm pool: long-lived child processes, each running many invocations.

Children are started as work arrives (:mod:`.placement` says which child takes an
invocation, or that a new one starts), at most one per invocation running, so never more
than the daemon's ``--capacity``. Each is a fresh interpreter (``python -m
lakeshore.daemon.child``, exec'd: safe for CUDA and threads, see docs/architecture.md)
that leads a process group of its own; the daemon's :mod:`.sentinel` is told each group,
so a daemon killed with SIGKILL leaves none behind.

A thread per child reads what it sends and hands it to the :class:`Ticket` of the
invocation it is about. When a child's connection ends (it crashed, exited, was killed
for a time-out or a lost lease, or was recycled), its group is killed and reaped, and
every invocation it still ran is told it ``died``; the next invocation starts a new child.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from lakeshore.daemon import placement
from lakeshore.daemon.sentinel import Sentinel, kill_group

log = logging.getLogger("lakeshore.daemon")


@dataclass(frozen=True)
class PoolConfig:
    preload: Sequence[str] = ()
    max_invocations_per_child: int | None = None
    max_memory_per_child_mb: float | None = None
    async_concurrency: int = 1


@dataclass(eq=False)
class Ticket:
    """One invocation sent to a child; ``post`` is handed what the child says of it
    (``item``, ``pause``, ``resume``, ``done``) and, if the child ends first, ``died``,
    from the child's reader thread. By default it goes to ``messages``, for a thread
    that waits; a waiter on an event loop passes its own (see :meth:`Pool.submit`)."""

    id: str
    fn: str
    child: ChildProcess
    kind: placement.Kind | None = None
    warm: bool = False  # its child has run ``fn`` before: it sends no ``begin`` for it
    messages: queue.Queue[tuple[Any, ...]] = field(default_factory=queue.Queue)
    post: Callable[[tuple[Any, ...]], None] | None = None

    def __post_init__(self) -> None:
        if self.post is None:
            self.post = self.messages.put

    def tell(self, message: tuple[Any, ...]) -> None:
        assert self.post is not None
        self.post(message)


@dataclass(eq=False)
class ChildProcess:
    process: subprocess.Popen[bytes]
    conn: Connection
    tickets: dict[str, Ticket] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)
    invocations: int = 0
    rss: int = 0
    retiring: bool = False
    killed_for: str | None = None  # why the pool killed it, for the invocations it ran
    exitcode: int | None = None
    send_lock: threading.Lock = field(default_factory=threading.Lock)
    reap_lock: threading.Lock = field(default_factory=threading.Lock)  # kill vs. reap

    @property
    def pid(self) -> int:
        return self.process.pid

    def view(self) -> placement.ChildView:
        tickets = self.tickets.values()
        return placement.ChildView(
            running=len(self.tickets),
            all_async=all(t.kind == "async" for t in tickets),
            seen=frozenset(self.seen),
            retiring=self.retiring,
        )

    def send(self, *message: Any) -> None:
        """Send, or nothing if it is gone (its reader tells its invocations)."""
        with self.send_lock, contextlib.suppress(OSError, ValueError):
            self.conn.send(message)


class Pool:
    def __init__(self, config: PoolConfig | None = None, sentinel: Sentinel | None = None) -> None:
        self.config = config or PoolConfig()
        self._sentinel = sentinel
        self._lock = threading.Lock()
        self._children: list[ChildProcess] = []
        self._kinds: dict[str, placement.Kind] = {}  # learnt from the children
        self._ids = itertools.count()
        self._readers: list[threading.Thread] = []
        self.started = 0  # children started, over the pool's life
        self.closed = False

    @property
    def children(self) -> list[int]:
        """The pids of the live children."""
        with self._lock:
            return [child.pid for child in self._children]

    def submit(
        self,
        fn: str,
        args: list[Any],
        kwargs: dict[str, Any],
        timeout_s: Any,
        post: Callable[[tuple[Any, ...]], None] | None = None,
    ) -> Ticket:
        """Send an invocation to the child that takes it, starting one if none can;
        what the child says of it goes to ``post`` (by default the ticket's
        ``messages``)."""
        with self._lock:
            if self.closed:
                raise RuntimeError("the pool is closed")
            views = [child.view() for child in self._children]
            index = placement.choose(views, fn, self._kinds.get(fn), self.config.async_concurrency)
            child = self._start() if index is None else self._children[index]
            ticket = Ticket(
                str(next(self._ids)),
                fn,
                child,
                self._kinds.get(fn),
                warm=fn in child.seen,
                post=post,
            )
            child.tickets[ticket.id] = ticket
            child.seen.add(fn)
        child.send("run", ticket.id, fn, args, kwargs, timeout_s)
        return ticket

    def cancel(self, ticket: Ticket) -> None:
        """Ask the child to cancel an async invocation (it answers ``done``/cancelled)."""
        ticket.child.send("cancel", ticket.id)

    def kill(self, child: ChildProcess, reason: str) -> None:
        """Kill a child and its group now; its reader tells its invocations."""
        with self._lock:
            child.retiring = True
            child.killed_for = child.killed_for or reason
        with child.reap_lock:
            if child.process.returncode is None:  # unreaped: its group id is still its own
                kill_group(child.pid)

    def close(self, within_s: float = 5.0) -> None:
        """Stop every child (they are idle once the daemon has drained): ask, then kill
        those still there after ``within_s``."""
        with self._lock:
            self.closed = True
            children = list(self._children)
            for child in children:
                child.retiring = True
        for child in children:
            child.send("exit")
        deadline = time.monotonic() + within_s
        for reader in list(self._readers):
            reader.join(max(0.0, deadline - time.monotonic()))
        for child in children:
            self.kill(child, "the daemon stopped")
        for reader in list(self._readers):
            reader.join(within_s)

    # --- below the lock -----------------------------------------------------------------

    def _start(self) -> ChildProcess:
        """Start a child (the pool's lock held) from a thread of its own that then reads
        from it until it ends: the parent-death signal fires when the thread that started
        a child ends, so that thread must live exactly as long as the child."""
        started: queue.Queue[ChildProcess | BaseException] = queue.Queue(maxsize=1)
        reader = threading.Thread(target=self._own, args=(started,), daemon=True)
        self._readers = [r for r in self._readers if r.is_alive()] + [reader]
        reader.start()
        child = started.get()
        if isinstance(child, BaseException):
            raise child
        self._children.append(child)
        self.started += 1
        return child

    def _own(self, started: queue.Queue[ChildProcess | BaseException]) -> None:
        try:
            child = self._spawn()
        except BaseException as exc:
            started.put(exc)
            return
        threading.current_thread().name = f"pool-child-{child.pid}"
        started.put(child)
        self._read(child)

    def _spawn(self) -> ChildProcess:
        """Its end of the socket is passed to it alone; every other descriptor is closed
        in it (the sentinel's pipe included)."""
        ours, theirs = socket.socketpair()
        argv = [sys.executable, "-m", "lakeshore.daemon.child", str(os.getpid())]
        try:
            process = subprocess.Popen(
                [*argv, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a group of its own, led by it
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        if self._sentinel is not None:
            self._sentinel.add(process.pid)
        child = ChildProcess(process, Connection(ours.detach()))
        child.send("init", {"path": list(sys.path), "preload": list(self.config.preload)})
        return child

    def _read(self, child: ChildProcess) -> None:
        try:
            while True:
                try:
                    message = child.conn.recv()
                except (EOFError, OSError):
                    return
                self._take(child, message)
        except Exception:  # a message not understood: the child is of no further use
            log.exception("pool child %d sent what the daemon cannot read", child.pid)
            self.kill(child, "it sent what the daemon cannot read")
        finally:
            self._bury(child)

    def _take(self, child: ChildProcess, message: tuple[Any, ...]) -> None:
        kind, tid = message[0], message[1]
        ticket = child.tickets.get(tid)
        if ticket is None:
            return
        if kind == "kind":
            with self._lock:
                ticket.kind = message[2]
                self._kinds[ticket.fn] = message[2]
            return
        if kind != "done":
            ticket.tell(message)
            return
        with self._lock:
            child.tickets.pop(tid, None)
            child.invocations += 1
            child.rss = message[4]
            if placement.recycle(
                child.invocations,
                child.rss,
                max_invocations=self.config.max_invocations_per_child,
                max_memory_mb=self.config.max_memory_per_child_mb,
            ):
                child.retiring = True
            retire = child.retiring and not child.tickets
        ticket.tell(message)
        if retire:
            log.info(
                "recycling child %d after %d invocation(s), %d MiB resident",
                child.pid,
                child.invocations,
                child.rss // placement.MIB,
            )
            child.send("exit")

    def _bury(self, child: ChildProcess) -> None:
        """The child's connection ended: kill what is left of its group while its leader
        is unreaped (the group's id cannot have been reused), reap the leader, then the
        members handed to this process; tell its invocations."""
        with child.reap_lock:
            kill_group(child.pid)
            child.exitcode = child.process.wait()
        _reap_group(child.pid)
        if self._sentinel is not None:
            self._sentinel.discard(child.pid)
        with self._lock:
            if child in self._children:
                self._children.remove(child)
            orphans = list(child.tickets.values())
            child.tickets.clear()
        child.conn.close()
        for ticket in orphans:
            ticket.tell(("died", ticket.id))


def _reap_group(pgid: int, within_s: float = 2.0) -> None:
    """Wait for the killed members of a group that were re-parented to this process (a
    subreaper), so none is left a zombie; those that are not its children are init's."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if os.waitid(os.P_PGID, pgid, os.WEXITED | os.WNOHANG) is None:
                time.sleep(0.005)  # members still dying (SIGKILL is on its way)
        except ChildProcessError:
            return
