"""The daemon's warm pool: long-lived child processes, each running many invocations.

Children are started as work arrives (:mod:`.placement` says which child takes an
invocation, or that a new one starts), or ahead of it (:meth:`Pool.warm`: the daemon
starts ``--capacity`` of them before its first claim, and replaces one that ends), never
more than the daemon's ``--capacity``. Each is a fresh interpreter (``python -m
lakeshore.daemon.child``, exec'd: safe for CUDA and threads, see docs/architecture.md)
that leads a process group of its own; the daemon's :mod:`.sentinel` is told each group,
so a daemon killed with SIGKILL leaves none behind.

What the children send is read on the event loop the pool was made on (the daemon's)
and handed straight to the :class:`Ticket` of the invocation it is about; one thread
starts every child and lives as long as the pool (a child's parent-death signal fires
when the thread that started it ends). When a child's connection ends (it crashed,
exited, was killed for a time-out or a lost lease, or was recycled), its group is killed
and reaped on a thread of its own, and every invocation it still ran is told it
``died``; the next invocation starts a new child.
"""

from __future__ import annotations

import asyncio
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
from typing import Any

from lakeshore.daemon import placement, wire
from lakeshore.daemon.runners import Invocation
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
    """One invocation sent to a child; ``tell`` is handed what the child says of it
    (``item``, ``pause``, ``resume``, ``done``) and, if the child ends first, ``died``,
    on the pool's loop (see :meth:`Pool.submit`)."""

    id: str
    fn: str
    child: ChildProcess
    tell: Callable[[tuple[Any, ...]], None]
    kind: placement.Kind | None = None
    warm: bool = False  # its child has run ``fn`` before: it sends no ``begin`` for it


@dataclass(eq=False)
class ChildProcess:
    process: subprocess.Popen[bytes]
    sock: socket.socket
    tickets: dict[str, Ticket] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)
    invocations: int = 0
    rss: int = 0
    retiring: bool = False
    ready: bool = False  # it said it has started up
    buried: bool = False  # reaped (under ``reap_lock``)
    killed_for: str | None = None  # why the pool killed it, for the invocations it ran
    exitcode: int | None = None
    frames: wire.Frames = field(default_factory=wire.Frames)
    send_lock: threading.Lock = field(default_factory=threading.Lock)
    reap_lock: threading.Lock = field(default_factory=threading.Lock)  # kill vs. reap

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def running(self) -> int:
        return len(self.tickets)

    @property
    def all_async(self) -> bool:
        return all(ticket.kind == "async" for ticket in self.tickets.values())

    def send(self, *message: Any) -> None:
        """Send, or nothing if it is gone (its burial tells its invocations)."""
        data = wire.pack(message)
        with self.send_lock, contextlib.suppress(OSError, ValueError):
            self.sock.sendall(data)


class Pool:
    """The children; what they send is read on ``loop`` (by default the running loop of
    its maker: the daemon's), where each ticket's ``tell`` is then called. ``close`` must
    not be called on that loop: it waits for the loop to bury children."""

    def __init__(
        self,
        config: PoolConfig | None = None,
        sentinel: Sentinel | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.config = config or PoolConfig()
        self._sentinel = sentinel
        self._lock = threading.Lock()
        self._buried = threading.Condition(self._lock)  # a child left ``_children``
        self._children: list[ChildProcess] = []
        self._kinds: dict[str, placement.Kind] = {}  # learnt from the children
        self._ids = itertools.count()
        self._loop = loop if loop is not None else asyncio.get_running_loop()
        self._starter: _Starter | None = None
        self._warm = 0  # children kept started ahead of work
        self._ready_waiters: list[asyncio.Future[None]] = []
        self.started = 0  # children started, over the pool's life
        self.closed = False

    @property
    def children(self) -> list[int]:
        """The pids of the live children."""
        with self._lock:
            return [child.pid for child in self._children]

    def submit(self, invocation: Invocation, tell: Callable[[tuple[Any, ...]], None]) -> Ticket:
        """Send an invocation to the child that takes it, starting one if none can;
        what the child says of it goes to ``tell``, on the pool's loop."""
        fn = invocation.fn
        with self._lock:
            if self.closed:
                raise RuntimeError("the pool is closed")
            kind, concurrency = self._kinds.get(fn), self.config.async_concurrency
            index = placement.choose(self._children, fn, kind, concurrency)
            child = self._start() if index is None else self._children[index]
            ticket = Ticket(str(next(self._ids)), fn, child, tell, kind, warm=fn in child.seen)
            child.tickets[ticket.id] = ticket
            child.seen.add(fn)
        child.send("run", ticket.id, fn, invocation.args, invocation.kwargs, invocation.timeout_s)
        return ticket

    def warm(self, count: int) -> None:
        """Start children until ``count`` are live, and keep that many: one that ends (a
        crash, a recycle, a kill) is replaced as it is buried, ahead of the next
        invocation. Each child's start-up then overlaps work instead of delaying it."""
        with self._lock:
            self._warm = count
            self._fill()

    async def warmed(self, within_s: float) -> bool:
        """Wait, on the pool's loop, until every live child has started up (up to
        ``within_s``); whether they all have."""
        loop = asyncio.get_running_loop()
        if self._all_ready():
            return True
        waiter: asyncio.Future[None] = loop.create_future()
        self._ready_waiters.append(waiter)
        try:
            async with asyncio.timeout(within_s):
                await waiter
            return True
        except TimeoutError:
            return False
        finally:
            self._ready_waiters.remove(waiter)

    def _all_ready(self) -> bool:
        return all(child.ready for child in list(self._children) if not child.retiring)

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
        with self._buried:
            self._buried.wait_for(lambda: not self._children, within_s)
        for child in children:
            self.kill(child, "the daemon stopped")
        with self._buried:
            self._buried.wait_for(lambda: not self._children, within_s)
            left = list(self._children)
        if left and not self._loop.is_running():
            for child in left:  # killed, and nothing reads it to its end now: reap it here
                self._bury(child, self._loop)
        if self._starter is not None:
            self._starter.stop()

    # --- below the lock -----------------------------------------------------------------

    def _fill(self) -> None:
        """Start children up to the warm count (the lock held)."""
        while not self.closed and sum(not c.retiring for c in self._children) < self._warm:
            self._start()

    def _start(self) -> ChildProcess:
        """Start a child (the lock held) and have the loop read it."""
        if self._starter is None:
            self._starter = _Starter()
        child = self._starter.call(self._spawn)
        self._children.append(child)
        self.started += 1
        if _running_on(self._loop):
            self._watch(child)
        else:  # a burial's thread starting a replacement, or a close loop
            try:
                self._loop.call_soon_threadsafe(self._watch, child)
            except RuntimeError:  # the loop is closed: nobody will read it
                child.retiring, child.killed_for = True, "the daemon stopped"
                kill_group(child.pid)
        return child

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
        child = ChildProcess(process, ours)
        child.send(
            "init",
            {
                "path": list(sys.path),
                "preload": list(self.config.preload),
                "rss": self.config.max_memory_per_child_mb is not None,
            },
        )
        return child

    # --- on the loop --------------------------------------------------------------------

    def _watch(self, child: ChildProcess) -> None:
        try:
            self._loop.add_reader(child.sock.fileno(), self._readable, child)
        except (OSError, ValueError):  # closed already
            self._ended(child)

    def _readable(self, child: ChildProcess) -> None:
        """What the child sent, all of it that has come; at the end, its burial."""
        try:
            data = child.sock.recv(wire.READ_SIZE, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if data:
            try:
                for message in child.frames.feed(data):
                    self._take(child, message)
                return
            except Exception:  # a message not understood: the child is of no further use
                log.exception("pool child %d sent what the daemon cannot read", child.pid)
                self.kill(child, "it sent what the daemon cannot read")
        self._ended(child)

    def _ended(self, child: ChildProcess) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._loop.remove_reader(child.sock.fileno())
        burial = threading.Thread(
            target=self._bury, args=(child, self._loop), name=f"pool-bury-{child.pid}"
        )
        burial.daemon = True
        burial.start()

    def _take(self, child: ChildProcess, message: tuple[Any, ...]) -> None:
        kind, tid = message[0], message[1]
        if kind == "ready":
            child.ready = True
            if self._ready_waiters and self._all_ready():
                for waiter in self._ready_waiters:
                    if not waiter.done():
                        waiter.set_result(None)
            return
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
            resident = f", {child.rss // placement.MIB} MiB resident" if child.rss else ""
            log.info(
                "recycling child %d after %d invocation(s)%s",
                child.pid,
                child.invocations,
                resident,
            )
            child.send("exit")

    def _bury(self, child: ChildProcess, loop: asyncio.AbstractEventLoop) -> None:
        """The child's connection ended: kill what is left of its group while its leader
        is unreaped (the group's id cannot have been reused), reap the leader, then the
        members handed to this process; tell its invocations (on the loop), and start its
        replacement if the pool is kept warm."""
        with child.reap_lock:
            if child.buried:  # by close(), or by the loop's burial meanwhile
                return
            child.buried = True
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
            self._buried.notify_all()
        child.sock.close()
        if orphans:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(_tell_died, orphans)
        with self._lock:
            try:
                self._fill()
            except OSError:  # out of processes or memory: the next invocation tries again
                log.exception("could not start a pool child ahead of work")


class _Starter:
    """One thread that starts every child of a pool and lives as long as the pool: the
    kernel's parent-death signal fires when the thread that started a child ends."""

    def __init__(self) -> None:
        self._requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="pool-starter", daemon=True)
        self._thread.start()

    def call(self, fn: Callable[[], ChildProcess]) -> ChildProcess:
        answer: queue.SimpleQueue[ChildProcess | BaseException] = queue.SimpleQueue()
        self._requests.put((fn, answer))
        child = answer.get()
        if isinstance(child, BaseException):
            raise child
        return child

    def stop(self) -> None:
        self._requests.put(None)
        self._thread.join(5.0)

    def _serve(self) -> None:
        while (request := self._requests.get()) is not None:
            fn, answer = request
            try:
                answer.put(fn())
            except BaseException as exc:
                answer.put(exc)


def _tell_died(tickets: list[Ticket]) -> None:
    for ticket in tickets:
        ticket.tell(("died", ticket.id))


def _running_on(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


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
