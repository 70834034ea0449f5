"""The ``thread`` runner: invocations on threads of the daemon itself, no child process.

For I/O-bound code that needs no isolation (calls to an API, a database, object storage):
no process to start, nothing pickled, and what a module keeps is shared by every
invocation the daemon runs. A plain function (or generator) runs on a thread of its own;
``async def`` functions and async generators run together on one event loop thread, each
under its own ``asyncio.timeout``. ``--preload`` modules are imported, and each
``@udf(setup=...)`` hook is run, once per daemon, before the first invocation that needs
them (not counted in ``timeout_s``).

What isolation gives, this runner does without: a crash of the interpreter (a segfault
in a C extension, ``os._exit``) takes the daemon down — its leases expire and the work is
retried, as after any daemon crash — and a thread cannot be killed. A plain function that
runs past its time-out, or whose lease is lost, has :class:`Stopped` raised in its
thread at its next Python instruction (a call blocked in C code raises as it returns);
the invocation fails (a time-out) or stops at once either way, and a thread that runs on
is logged. An ``async def`` invocation is cancelled.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import queue
import threading
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Future
from typing import Any

from lakeshore import jsontext
from lakeshore.daemon import calls
from lakeshore.daemon.runner import GIVE_WAY_S, Outcome, outcome_of, stopped, timed_out

log = logging.getLogger("lakeshore.daemon")

Event = tuple[str, Any]  # a reply of :mod:`.calls`, ("timeout"|"cancelled", None), ("kill", None)


class Stopped(BaseException):
    """Raised in a plain function's thread to end it (its time-out, a lost lease, a stop).
    A ``BaseException``, so a UDF's ``except Exception`` does not swallow it."""


class Threads:
    """The daemon's thread runner: what it keeps across invocations (the preloads done,
    the set-up hooks run, the event loop of async functions)."""

    def __init__(self, preload: Sequence[str] = ()) -> None:
        self._preload = list(preload)  # still to import (a failure is tried again)
        self._lock = threading.Lock()  # imports and set-up hooks, one at a time
        self._set_up: set[int] = set()  # id() of each hook that ran to its end
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._loop_lock = threading.Lock()

    def run(
        self,
        fn: str,
        args: list[Any],
        kwargs: dict[str, Any],
        timeout_s: float | None,
        on_item: Callable[[Any], None] | None = None,
    ) -> ThreadRun:
        return ThreadRun(self, fn, args, kwargs, timeout_s, on_item)

    def close(self, within_s: float = 5.0) -> None:
        """Stop the event loop thread (once the daemon has drained, nothing runs on it)."""
        loop, thread = self._loop, self._loop_thread
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(within_s)
        if not thread.is_alive():
            loop.close()
        self._loop = self._loop_thread = None

    def prepare(self, fn: str) -> Any:
        """The preloads still to do, then ``fn``'s target and its set-up hook (once per
        daemon): the target, or an error reply."""
        with self._lock:
            target = calls.prepare(self._preload, fn)
            if isinstance(target, tuple):
                return target
            hook = calls.setup_of(target)
            if hook is not None and id(hook) not in self._set_up:
                try:
                    result = hook()
                    if asyncio.iscoroutine(result):
                        self.submit(result).result()
                except Exception as exc:
                    return calls.error(exc, prefix=f"set-up {calls.name_of(hook)} failed: ")
                self._set_up.add(id(hook))
        return target

    def submit(self, coroutine: Coroutine[Any, Any, Any]) -> Future[Any]:
        """Run a coroutine on the runner's event loop thread (started on first use)."""
        with self._loop_lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="udf-loop", daemon=True)
                thread.start()
                self._loop, self._loop_thread = loop, thread
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)


class ThreadRun:
    """One invocation on the thread runner, with the interface of :class:`.runner.Run`:
    call it (blocking, from a thread) for its :class:`Outcome`; ``kill`` ends it early."""

    def __init__(
        self,
        threads: Threads,
        fn: str,
        args: list[Any],
        kwargs: dict[str, Any],
        timeout_s: float | None,
        on_item: Callable[[Any], None] | None,
    ) -> None:
        self.threads, self.fn, self.timeout_s = threads, fn, timeout_s
        self._args, self._kwargs, self._on_item = args, kwargs, on_item
        self._events: queue.Queue[Event] = queue.Queue()
        self._ended = False  # once set, a generator's next item stops it
        self._killed = False
        self._task: asyncio.Task[Event] | None = None

    def kill(self) -> None:
        self._killed = True
        self._events.put(("kill", None))

    def __call__(self) -> Outcome:
        target = self.threads.prepare(self.fn)
        if isinstance(target, tuple):
            return outcome_of(self.fn, self.timeout_s, *target)
        if self._killed:
            return stopped(self.fn)
        if calls.is_async(target):
            return self._run_async(target)
        return self._run_plain(target)

    def _emit(self, text: str) -> None:
        if self._ended:
            raise Stopped
        if self._on_item is not None:
            self._on_item(jsontext.parsed(text.encode()))

    def _next(self, within_s: float | None) -> Event | None:
        try:
            return self._events.get(timeout=within_s)
        except queue.Empty:
            return None

    # --- a plain function (or generator) on a thread of its own ---------------------

    def _run_plain(self, target: Any) -> Outcome:
        thread = threading.Thread(target=self._body, args=(target,), name=self.fn, daemon=True)
        thread.start()
        event = self._next(self.timeout_s)
        if event is not None and event[0] != "kill":
            return outcome_of(self.fn, self.timeout_s, *event)
        self._ended = True
        _raise_in(thread)
        thread.join(GIVE_WAY_S)
        if thread.is_alive():
            log.warning("%s runs on in its thread after it was stopped", self.fn)
        return timed_out(self.fn, self.timeout_s) if event is None else stopped(self.fn)

    def _body(self, target: Any) -> None:
        try:
            reply = calls.call(self.fn, target, self._args, self._kwargs, self._emit, asyncio.run)
        except Stopped:
            reply = ("cancelled", None)
        self._events.put(reply)

    # --- async def on the runner's event loop ---------------------------------------

    def _run_async(self, target: Any) -> Outcome:
        future = self.threads.submit(self._main(target))
        future.add_done_callback(self._settled)
        # its own asyncio.timeout ends it; past that plus a moment, it blocks its loop
        limit = None if self.timeout_s is None else self.timeout_s + GIVE_WAY_S
        event = self._next(limit)
        if event is not None and event[0] != "kill":
            return outcome_of(self.fn, self.timeout_s, *event)
        self._ended = True
        loop, task = self.threads._loop, self._task
        if loop is not None and task is not None:
            loop.call_soon_threadsafe(task.cancel)
        if self._next(GIVE_WAY_S) is None:
            log.warning("%s did not give way within %.0f s of its cancel", self.fn, GIVE_WAY_S)
        return timed_out(self.fn, self.timeout_s) if event is None else stopped(self.fn)

    def _settled(self, future: Future[Event]) -> None:
        failed = future.cancelled() or future.exception() is not None
        self._events.put(("cancelled", None) if failed else future.result())

    async def _main(self, target: Any) -> Event:
        self._task = asyncio.current_task()
        if self._ended:  # stopped before it began
            return ("cancelled", None)
        try:
            async with asyncio.timeout(self.timeout_s):
                return await calls.call_async(self.fn, target, self._args, self._kwargs, self._emit)
        except TimeoutError:
            return ("timeout", None)
        except asyncio.CancelledError:
            return ("cancelled", None)


def _raise_in(thread: threading.Thread) -> None:
    """Raise :class:`Stopped` in ``thread`` at its next Python instruction."""
    if thread.ident is not None and thread.is_alive():
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(thread.ident), ctypes.py_object(Stopped)
        )
