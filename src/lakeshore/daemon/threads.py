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

The daemon's event loop waits for each invocation's outcome: a thread (or the runner's
loop) hands its reply to a future of the daemon's loop, and a timer of that loop stands
for its time-out.
"""

from __future__ import annotations

import _thread
import asyncio
import contextlib
import ctypes
import logging
import threading
from collections.abc import Coroutine, Sequence
from concurrent.futures import Future
from typing import Any

from lakeshore import jsontext
from lakeshore.daemon import calls
from lakeshore.daemon.runner import GIVE_WAY_S, Outcome, outcome_of, stopped, timed_out
from lakeshore.daemon.runners import Begun, Invocation, OnItem, awaited, until_ended

log = logging.getLogger("lakeshore.daemon")

Event = tuple[str, Any]  # a reply of :mod:`.calls`, or ("cancelled", None)


class Stopped(BaseException):
    """Raised in a plain function's thread to end it (its time-out, a lost lease, a stop).
    A ``BaseException``, so a UDF's ``except Exception`` does not swallow it."""


class Threads:
    """The thread runner (:class:`~.runners.Runner`): what it keeps across invocations
    (the preloads done, the set-up hooks run, each function looked up, the event loop of
    async functions)."""

    def __init__(self, preload: Sequence[str] = ()) -> None:
        self._preload = list(preload)  # still to import (a failure is tried again)
        self._lock = threading.Lock()  # imports and set-up hooks, one at a time
        self._set_up: set[int] = set()  # id() of each hook that ran to its end
        self._targets: dict[str, Any] = {}  # each fn prepared, its set-up hook run
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._loop_lock = threading.Lock()

    def warm(self, capacity: int) -> None:
        """Nothing to start ahead: preloads and set-up hooks wait for their first use."""

    async def run(self, invocation: Invocation, on_item: OnItem | None = None) -> Outcome:
        fn = invocation.fn
        target = self._targets.get(fn)
        if target is None:  # imports and set-up hooks block: on a thread, not on the loop
            preparing = asyncio.get_running_loop().run_in_executor(None, self.prepare, fn)
            target = await until_ended(preparing, _nothing)
            if isinstance(target, tuple):
                return outcome_of(fn, invocation.timeout_s, *target)
        run = ThreadRun(self, invocation, on_item)
        return await awaited(run.begin(target), run)

    async def close(self) -> None:
        await asyncio.to_thread(self._close)

    def _close(self, within_s: float = 5.0) -> None:
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
            self._targets[fn] = target
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


class ThreadRun(Begun):
    """One invocation on the thread runner: ``begin`` starts it and hands back the future
    of its outcome, on the running loop; ``kill`` and ``stop`` (on that loop) end it
    early."""

    def __init__(self, threads: Threads, invocation: Invocation, on_item: OnItem | None) -> None:
        self.threads, self.invocation, self._on_item = threads, invocation, on_item
        self.fn, self.timeout_s = invocation.fn, invocation.timeout_s
        self._ended = False  # once set, a generator's next item stops it
        self._ending: str | None = None  # "timeout" or "stopped", once decided
        self._timer: asyncio.TimerHandle | None = None
        self._plain = False  # a plain function, on a thread of its own
        self._ident: int | None = None  # that thread's, while it runs the function
        self._task: asyncio.Task[Event] | None = None  # an async one's, on the runner's loop
        self._loop: asyncio.AbstractEventLoop | None = None

    def begin(self, target: Any) -> asyncio.Future[Outcome]:
        loop = self._loop = asyncio.get_running_loop()
        self._waiting = done = loop.create_future()
        limit = self.timeout_s
        if calls.is_async(target):
            self.threads.submit(self._main(target)).add_done_callback(self._settled)
            # its own asyncio.timeout ends it; past that plus a moment, it blocks its loop
            limit = None if limit is None else limit + GIVE_WAY_S
        else:
            # not threading.Thread: its start() waits, on the daemon's loop, until the
            # new thread has run (halving the runner's throughput with 8 at once)
            self._plain = True
            _thread.start_new_thread(self._body, (target,))
        if limit is not None:
            self._timer = loop.call_later(limit, self._end, "timeout")
        return done

    def kill(self) -> None:
        self._end("stopped")

    def _end(self, why: str) -> None:
        """Past its time-out, or stopped: end it, and wait a moment for it to give way."""
        if self._ending is not None or self._loop is None or self.outcome is not None:
            return
        assert self._loop is not None
        self._ending, self._ended = why, True
        if self._timer is not None:
            self._timer.cancel()
        if self._plain:
            ident = self._ident  # None: not begun (it sees _ended), or returned
            if ident is not None:
                _raise_in(ident)
        elif self.threads._loop is not None and self._task is not None:
            self.threads._loop.call_soon_threadsafe(self._task.cancel)
        self._timer = self._loop.call_later(GIVE_WAY_S, self._gave_up)

    def _gave_up(self) -> None:
        if self._plain:
            log.warning("%s runs on in its thread after it was stopped", self.fn)
        else:
            log.warning("%s did not give way within %.0f s of its cancel", self.fn, GIVE_WAY_S)
        self._finish(None)

    def _reply(self, event: Event) -> None:
        """Its reply (from its thread, or the runner's loop)."""
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            self._loop.call_soon_threadsafe(self._finish, event)

    def _finish(self, event: Event | None) -> None:
        if self.outcome is not None:
            return
        if self._timer is not None:
            self._timer.cancel()
        if self._ending == "timeout":
            self._resolve(timed_out(self.fn, self.timeout_s))
        elif self._ending is not None:
            self._resolve(stopped(self.fn))
        else:
            assert event is not None
            self._resolve(outcome_of(self.fn, self.timeout_s, *event))

    def _emit(self, text: str) -> None:
        if self._ended:
            raise Stopped
        if self._on_item is not None:
            self._on_item(jsontext.parsed(text.encode()))

    # --- a plain function (or generator) on a thread of its own ---------------------

    def _body(self, target: Any) -> None:
        invocation, reply = self.invocation, ("cancelled", None)
        try:
            self._ident = threading.get_ident()
            try:
                if not self._ended:  # else stopped before it began
                    reply = calls.call(
                        self.fn, target, invocation.args, invocation.kwargs, self._emit, asyncio.run
                    )
            finally:
                self._ident = None  # nothing is raised in this thread from here on
        except Stopped:
            pass
        self._reply(reply)

    # --- async def on the runner's event loop ---------------------------------------

    def _settled(self, future: Future[Event]) -> None:
        failed = future.cancelled() or future.exception() is not None
        self._reply(("cancelled", None) if failed else future.result())

    async def _main(self, target: Any) -> Event:
        self._task = asyncio.current_task()
        if self._ended:  # stopped before it began
            return ("cancelled", None)
        invocation = self.invocation
        try:
            async with asyncio.timeout(self.timeout_s):
                return await calls.call_async(
                    self.fn, target, invocation.args, invocation.kwargs, self._emit
                )
        except TimeoutError:
            return ("timeout", None)
        except asyncio.CancelledError:
            return ("cancelled", None)


def _nothing() -> None:
    """A set-up cannot be stopped: a cancel waits for it to end."""


def _raise_in(ident: int) -> None:
    """Raise :class:`Stopped` in the thread ``ident`` at its next Python instruction."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(Stopped))
