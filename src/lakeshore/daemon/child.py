"""A pool child: a long-lived process that runs invocations one after another.

Started by :mod:`.pool` as ``python -m lakeshore.daemon.child PARENT_PID FD`` — a fresh
interpreter, so nothing of the daemon's memory or threads comes along and CUDA may be
initialised here. It leads a process group of its own (whatever a UDF starts joins it),
dies with the daemon (the parent-death signal), and adopts its UDFs' orphans (a
subreaper) so it can reap them. It takes the daemon's ``sys.path`` and imports the
``--preload`` modules before its first invocation; modules, and whatever they keep, stay
for the next invocation: that is the warm state.

On the connection (pickled tuples) it receives ``("run", id, fn, args, kwargs,
timeout_s)``, ``("cancel", id)`` and ``("exit",)``. It sends ``("ready", None)`` once it
has started up, ``("begin", id)`` as it takes
an invocation up (its ``timeout_s`` runs from there), ``("pause", id)`` / ``("resume",
id)`` around set-up (preloads, a module's first import, a ``@udf(setup=...)`` hook: the
child warming up, not counted in ``timeout_s``), ``("kind", id, "plain" | "async")`` once
it has imported ``fn`` (``begin`` and ``kind`` only for a function it has not run yet: the
daemon, which knows which functions a child has run, starts the clock of the others),
``("item", id, json)`` per item streamed, and ``("done", id, kind, payload, rss)`` where
``kind`` is ``ok``, ``error``, ``timeout`` or ``cancelled`` and ``rss`` the child's resident
memory (0 unless ``init`` asked for it: the daemon recycles children by memory).

A plain function runs on the main thread, alone (the daemon sends nothing else meanwhile);
``async def`` ones run on an event loop kept for the child's life, several at once
(:meth:`Child._serve_async`), each under its own ``asyncio.timeout``. When the child is
idle, what its UDFs left running in its group is killed and reaped.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from lakeshore.daemon import calls, linux, wire

if TYPE_CHECKING:
    import asyncio

Reply = calls.Reply


class Target(NamedTuple):
    """A function as a child runs it: what its name resolved to, whether it is async, and
    its ``@udf(setup=...)`` hook."""

    call: Any
    is_async: bool
    setup: Callable[[], Any] | None


class Channel:
    """The child's end of its socket to the daemon (read and written as a plain fd)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.frames = wire.Frames()
        self.inbox: collections.deque[tuple[Any, ...]] = collections.deque()
        self.outbox: list[tuple[Any, ...]] = []

    def send(self, message: tuple[Any, ...]) -> None:
        self._write(wire.pack(message))

    def later(self, message: tuple[Any, ...]) -> bool:
        """Keep a message for :meth:`flush`; whether it is the first kept."""
        self.outbox.append(message)
        return len(self.outbox) == 1

    def flush(self) -> None:
        if self.outbox:
            data, self.outbox = wire.pack_all(self.outbox), []
            self._write(data)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]

    def receive(self) -> tuple[Any, ...] | None:
        """The next message, waiting for it; None once the daemon is gone."""
        while not self.inbox:
            if not self.read():
                return None
        return self.inbox.popleft()

    def read(self) -> bool:
        """One read (it waits only if nothing has come); False at the end."""
        try:
            data = os.read(self.fd, wire.READ_SIZE)
        except OSError:
            return False
        if not data:
            return False
        self.inbox.extend(self.frames.feed(data))
        return True


class Child:
    def __init__(self, conn: Channel, preload: list[str], rss: bool = True) -> None:
        self.conn = conn
        self.preload = list(preload)  # still to import (a failure is tried again)
        # each function imported here (no begin, no kind for it), as it runs: a warm child
        # looks a function up once (an import and an unwrap each time were half its cost)
        self.targets: dict[str, Target] = {}
        self.rss = rss  # whether each outcome carries the resident memory (a read of /proc)
        self.set_up: set[int] = set()  # id() of each hook that ran to its end here
        self.hooks: dict[int, asyncio.Task[None]] = {}  # async hooks under way
        self._loop: asyncio.AbstractEventLoop | None = None
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.waiting: list[tuple[Any, ...]] = []  # plain runs that came during async ones
        self.idle: asyncio.Future[None] | None = None
        self.exiting = False

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The child's event loop, made on first need: asyncio is a third of a bare
        child's imports, and plain functions that return no coroutine never need it."""
        if self._loop is None:
            import asyncio

            self._loop = asyncio.new_event_loop()
        return self._loop

    def send(self, *message: Any) -> None:
        self.conn.send(message)

    def send_soon(self, *message: Any) -> None:
        """On the event loop: outcomes and items that end in the same turn of the loop go
        to the daemon in one write."""
        if self.conn.later(message):
            self.loop.call_soon(self.conn.flush)

    def serve(self) -> None:
        while not self.exiting:
            message = self.waiting.pop(0) if self.waiting else self.conn.receive()
            if message is None or message[0] == "exit":
                return
            if message[0] == "run":
                self._run(*message[1:])

    def _lookup(self, tid: str, fn: str) -> Target | Reply:
        """``fn`` as this child runs it, or an error reply: as it was looked up, once it has
        run here and no preload is left to do, else :meth:`_prepare`'s."""
        found = None if self.preload else self.targets.get(fn)
        return found if found is not None else self._prepare(tid, fn)

    def _prepare(self, tid: str, fn: str) -> Target | Reply:
        """Preloads still to do, then import ``fn``: how it runs, or an error reply. The
        imports are the child's warming up, not counted in the invocation's time-out."""
        known = fn in self.targets and not self.preload
        if not known:  # the daemon starts the clock of a function this child knows itself
            self.send("begin", tid)  # its clock starts
        warming = bool(self.preload) or fn.partition(":")[0] not in sys.modules
        if warming:
            self.send("pause", tid)
        try:
            target = calls.prepare(self.preload, fn)
        finally:
            if warming:
                self.send("resume", tid)
        if isinstance(target, tuple):
            return target
        found = Target(target, calls.is_async(target), calls.setup_of(target))
        if not known:
            self.send("kind", tid, "async" if found.is_async else "plain")
        self.targets[fn] = found
        return found

    def _run(
        self, tid: str, fn: str, args: list[Any], kwargs: dict[str, Any], timeout_s: Any
    ) -> None:
        found = self._lookup(tid, fn)
        if not isinstance(found, Target):
            self._done(tid, found)
            return
        if found.is_async:
            self._serve_async(tid, fn, found, args, kwargs, timeout_s)
            return
        reply = self._set_up(tid, found.setup)
        if reply is None:
            emit = self._emitter(tid)
            reply = calls.call(fn, found.call, args, kwargs, emit, self._until_done)
        self._clean_group()
        self._done(tid, reply)

    def _until_done(self, awaitable: Any) -> Any:
        """Run a coroutine a plain function returned: the loop is made only then."""
        return self.loop.run_until_complete(awaitable)

    def _emitter(self, tid: str, soon: bool = False) -> Callable[[str], None]:
        send = self.send_soon if soon else self.send
        return lambda text: send("item", tid, text)

    def _done(self, tid: str, reply: Reply, soon: bool = False) -> None:
        _flush_output()
        rss = linux.rss_bytes() if self.rss else 0
        (self.send_soon if soon else self.send)("done", tid, reply[0], reply[1], rss)

    def _set_up(self, tid: str, hook: Callable[[], Any] | None) -> Reply | None:
        """Run a target's set-up hook unless it ran here already; an error reply if it
        raised (tried again by the next invocation)."""
        if hook is None or id(hook) in self.set_up:
            return None
        self.send("pause", tid)
        try:
            result = hook()
            if calls.is_coroutine(result):
                self.loop.run_until_complete(result)
        except Exception as exc:
            return calls.error(exc, prefix=f"set-up {calls.name_of(hook)} failed: ")
        finally:
            self.send("resume", tid)
        self.set_up.add(id(hook))
        return None

    # --- async def: several at once on the child's loop -------------------------------

    def _serve_async(
        self,
        tid: str,
        fn: str,
        target: Target,
        args: list[Any],
        kwargs: dict[str, Any],
        timeout_s: Any,
    ) -> None:
        """Run async invocations, taking more as they come, until none is left."""
        self.loop.add_reader(self.conn.fd, self._on_readable)
        try:
            self._start(tid, fn, target, args, kwargs, timeout_s)
            # messages that came in the same read as this one wait in the inbox: the
            # socket will not turn readable for them
            self._take_inbox()
            # an invocation taken up as the last one ended (before the loop stopped)
            # needs the loop too
            while self.tasks:
                self.idle = self.loop.create_future()
                self.loop.run_until_complete(self.idle)
        finally:
            self.loop.remove_reader(self.conn.fd)
            self.conn.flush()
        self._clean_group()

    def _on_readable(self) -> None:
        if not self.conn.read():
            self._on_message(None)
        self._take_inbox()

    def _take_inbox(self) -> None:
        while self.conn.inbox and not self.exiting:
            self._on_message(self.conn.inbox.popleft())

    def _on_message(self, message: tuple[Any, ...] | None) -> None:
        if message is None or message[0] == "exit":
            self.exiting = True
            for task in self.tasks.values():
                task.cancel()
            return
        if message[0] == "cancel":
            if message[1] in self.tasks:
                self.tasks[message[1]].cancel()
            return
        if message[0] != "run":
            return
        _, tid, fn, args, kwargs, timeout_s = message
        self.conn.flush()  # what ended before it, before its begin and kind
        found = self._lookup(tid, fn)
        if not isinstance(found, Target):
            self._done(tid, found)
        elif found.is_async:
            self._start(tid, fn, found, args, kwargs, timeout_s)
        else:  # not sent while async work runs; kept for when it is done
            self.waiting.append(message)

    def _start(
        self,
        tid: str,
        fn: str,
        target: Target,
        args: list[Any],
        kwargs: dict[str, Any],
        timeout_s: Any,
    ) -> None:
        task = self.loop.create_task(self._run_async(tid, fn, target, args, kwargs, timeout_s))
        self.tasks[tid] = task
        task.add_done_callback(lambda _: self._finished(tid))

    def _finished(self, tid: str) -> None:
        self.tasks.pop(tid, None)
        if not self.tasks and self.idle is not None and not self.idle.done():
            self.idle.set_result(None)

    async def _run_async(
        self,
        tid: str,
        fn: str,
        target: Target,
        args: list[Any],
        kwargs: dict[str, Any],
        timeout_s: Any,
    ) -> None:
        import asyncio

        reply: Reply
        try:
            failed = await self._set_up_async(tid, target.setup)
            if failed is not None:
                reply = failed
            else:
                async with asyncio.timeout(timeout_s):
                    emit = self._emitter(tid, soon=True)
                    reply = await calls.call_async(fn, target.call, args, kwargs, emit)
        except TimeoutError:
            reply = ("timeout", None)
        except asyncio.CancelledError:
            reply = ("cancelled", None)
        self._done(tid, reply, soon=True)

    async def _set_up_async(self, tid: str, hook: Callable[[], Any] | None) -> Reply | None:
        """The hook once per child, shared by the invocations that wait for it."""
        import asyncio

        if hook is None or id(hook) in self.set_up:
            return None
        self.send("pause", tid)
        try:
            if id(hook) not in self.hooks:
                self.hooks[id(hook)] = self.loop.create_task(self._hook(hook))
            await asyncio.shield(self.hooks[id(hook)])
        except Exception as exc:
            return calls.error(exc, prefix=f"set-up {calls.name_of(hook)} failed: ")
        finally:
            self.send("resume", tid)
        return None

    async def _hook(self, hook: Callable[[], Any]) -> None:
        try:
            result = hook()
            if calls.is_coroutine(result):
                await result
            self.set_up.add(id(hook))
        finally:
            self.hooks.pop(id(hook), None)

    # --- what the UDFs left behind ------------------------------------------------------

    def _clean_group(self, within_s: float = 2.0) -> None:
        """Kill the other members of this child's group (what its UDFs started and left
        running) and reap them: they are its children, or were re-parented to it."""
        try:  # no child at all (one system call): as a subreaper, then no descendant
            os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        from lakeshore import processes  # psutil: only a child whose UDFs start processes

        me = os.getpid()  # listing a group costs milliseconds: only when there may be some
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            others = [p.pid for p in processes.group_members(me) if p.pid != me]
            if not others:
                return
            for pid in others:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass
            time.sleep(0.002)  # SIGKILL is on its way


def _flush_output() -> None:
    """What the UDF printed, to the daemon's log."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:  # a UDF replaced or closed them: the next flush tries again
        with contextlib.suppress(Exception):
            sys.stderr.flush()


def main(argv: list[str]) -> None:
    parent, fd = int(argv[1]), int(argv[2])
    linux.die_with_parent(parent)
    linux.become_subreaper()
    conn = Channel(fd)
    message = conn.receive()
    if message is None:  # the daemon is gone already
        os._exit(0)
    init = message[1]
    sys.path[:] = init["path"]  # import UDFs as the daemon would
    conn.send(("ready", None))  # started up: the daemon may claim work for it
    try:
        Child(conn, init["preload"], init.get("rss", True)).serve()
    finally:
        _flush_output()
        os._exit(0)  # like a forked child: no interpreter shutdown waiting on UDF threads


if __name__ == "__main__":
    main(sys.argv)
