"""Waking waiting claims the moment work arrives, instead of on their next poll.

A claim registers interest in its queues *before* it looks for work, so a submit that
lands between the look and the wait still wakes it. This is the in-process half;
across server replicas PostgreSQL ``LISTEN/NOTIFY`` feeds the same ``notify``
(``lakeshore.store.wakeups``). Keys are queue ids (work to claim) and ``stream:<id>``
(an invocation's stream grew or ended).
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import gc
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Literal

log = logging.getLogger("lakeshore.memory")


class Notifier:
    def __init__(self) -> None:
        self._waiters: defaultdict[str, set[Bell]] = defaultdict(set)
        self._taps: list[Callable[[str], None]] = []

    def notify(self, queue_ids: Iterable[str]) -> None:
        for queue_id in queue_ids:
            for event in self._waiters.get(queue_id, ()):
                event.set()
            for tap in self._taps:
                tap(queue_id)

    def waiting(self) -> int:
        """How many waits are registered now (each waiting claim or stream follower)."""
        return len({id(event) for events in self._waiters.values() for event in events})

    @contextmanager
    def tapped(self, tap: Callable[[str], None]) -> Iterator[None]:
        """Hand ``tap`` every key notified while inside (on the event loop; it must not
        block): the controller's loop hears submits this way."""
        self._taps.append(tap)
        try:
            yield
        finally:
            self._taps.remove(tap)

    def notify_all(self) -> None:
        """Wake every waiter (after wake-ups may have been missed)."""
        for events in list(self._waiters.values()):
            for event in events:
                event.set()

    @contextmanager
    def listen(self, queue_ids: Iterable[str], event: Bell | None = None) -> Iterator[Bell]:
        """Set ``event`` (a new one unless given) on every notify of these keys while
        inside."""
        event = Bell() if event is None else event
        keys = list(queue_ids)
        for key in keys:
            self._waiters[key].add(event)
        try:
            yield event
        finally:
            for key in keys:
                waiters = self._waiters.get(key)
                if waiters is not None:
                    waiters.discard(event)
                    if not waiters:
                        del self._waiters[key]


class Bell(asyncio.Event):
    """An :class:`asyncio.Event` without its deque of waiters (760 bytes, a third of an
    event's cost to a waiting claim's memory), whose :meth:`wait_at_most` times out
    without an exception or a timeout object: a claim's wait that runs out (an idle
    worker's, every 20 s) leaves no exception and traceback behind for the collector."""

    def __init__(self) -> None:  # not super().__init__(): it makes the deque
        self._value = False
        self._waiters: list[asyncio.Future[bool]] = []  # type: ignore[assignment]

    def set(self) -> None:
        if not self._value:
            self._value = True
            for waiter in self._waiters:
                if not waiter.done():
                    waiter.set_result(True)

    def clear(self) -> None:
        self._value = False

    def is_set(self) -> bool:
        return self._value

    async def wait(self) -> Literal[True]:
        if not self._value:
            await self._waited(None)
        return True

    async def wait_at_most(self, seconds: float) -> None:
        """Until set, at most ``seconds`` (a timeout returns; nothing is raised)."""
        if not self._value and seconds > 0:
            await self._waited(seconds)

    async def _waited(self, seconds: float | None) -> None:
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        self._waiters.append(waiter)
        timer = None if seconds is None else loop.call_later(seconds, _ring, waiter)
        try:
            await waiter
        finally:
            if timer is not None:
                timer.cancel()
            self._waiters.remove(waiter)


def _ring(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(False)


class Hangup:
    """Set once a waiting claim's caller is gone (it hung up, or the server is
    stopping). Setting it also rings ``bell``, which the claim's notifier wake-ups and
    hand-off ring too: a waiting claim waits on that one event, with no task of its own
    (a server holding many waiting claims keeps few objects for each:
    ``bench/longpoll_memory.py``)."""

    __slots__ = ("_set", "bell")

    def __init__(self) -> None:
        self._set = False
        self.bell = Bell()

    def set(self) -> None:
        self._set = True
        self.bell.set()

    def is_set(self) -> bool:
        return self._set


class HangupWatch:
    """Sets ``gone`` when ``receive`` (an ASGI request's, its body read already) says the
    client disconnected. No task: the ``receive()`` coroutine is stepped from the done
    callbacks of the futures it waits on, as a task would step it, but without the
    task's own objects (the task, its context, its entry among the loop's tasks, the
    cancellation's exception at the end). :meth:`close` stops it."""

    __slots__ = ("_coro", "_gone", "_receive")

    def __init__(self, receive: Callable[[], Awaitable[Mapping[str, Any]]], gone: Hangup) -> None:
        self._receive, self._gone = receive, gone
        self._coro: Coroutine[Any, Any, Mapping[str, Any]] | None = None
        self._step(None)

    def close(self) -> None:
        coro, self._coro = self._coro, None
        if coro is not None:
            coro.close()  # its wait's finally blocks run: nothing is left waiting

    def _step(self, waited: asyncio.Future[Any] | None) -> None:
        if self._coro is None:
            if waited is not None:
                return  # closed while the future it waited on completed
            self._coro = _as_coroutine(self._receive())
        try:
            if waited is not None and (waited.cancelled() or waited.exception()):
                # as a task would: the wait's cancellation or error goes in
                yielded = self._coro.throw(_raised(waited))
            else:
                yielded = self._coro.send(None)
        except StopIteration as done:
            self._coro = None
            if done.value.get("type") == "http.disconnect":
                self._gone.set()
            else:  # a message of the body (read already): read on, in a later step
                asyncio.get_running_loop().call_soon(self._step, None)
            return
        except (Exception, asyncio.CancelledError):  # receive failed: stop watching
            self._coro = None
            return
        if yielded is None:  # a bare yield (sleep(0)): step again soon
            asyncio.get_running_loop().call_soon(self._step, None)
        elif hasattr(yielded, "add_done_callback"):  # a future, as a task would take it
            yielded._asyncio_future_blocking = False
            yielded.add_done_callback(self._step)
        else:  # not an asyncio awaitable: stop watching
            self.close()


def _raised(future: asyncio.Future[Any]) -> BaseException:
    if future.cancelled():
        return asyncio.CancelledError()
    error = future.exception()
    assert error is not None
    return error


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def _as_coroutine(awaitable: Awaitable[Any]) -> Coroutine[Any, Any, Any]:
    return awaitable if isinstance(awaitable, Coroutine) else _awaited(awaitable)


async def wait_one(event: Bell, seconds: float) -> None:
    """Until ``event`` is set, at most ``seconds``; no task is made for it."""
    await event.wait_at_most(seconds)


async def wait_any(events: list[asyncio.Event], seconds: float) -> None:
    """Until one of ``events`` is set, at most ``seconds``."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


def release_memory() -> None:
    """Free the cyclic garbage and CPython's free lists (a full collection), then ask the
    C allocator to hand its free pages back to the system (glibc's ``malloc_trim``;
    without glibc, the collection alone)."""
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    return trim


class AfterBursts:
    """Hands memory back to the system once a burst of claims has ended.

    Each claim in progress holds some 37 KB (its connection, its request's objects, the
    framework's and the middlewares' frames); when a burst of them ends, the memory is
    free for the next but stays with the process: the server's RSS keeps the burst's
    high-water mark. :meth:`count` is told the number of claims in progress whenever one
    begins or ends; once that number has been at least ``least`` and has fallen to a
    quarter of its highest, and has stopped falling for ``delay_s`` (the burst's last
    claims have ended), :func:`release_memory` runs (``release``) unless claims are back
    by then. It is the only full collection of the process at that time
    (:mod:`lakeshore.runtime` makes them rare), so a release is held off until
    ``min_gap_s`` after the last, and until 100 times the CPU time the last one took after
    it: releases take at most about 1 % of the event loop's time."""

    def __init__(
        self,
        *,
        least: int = 64,
        delay_s: float = 1.0,
        min_gap_s: float = 5.0,
        release: Callable[[], None] = release_memory,
    ) -> None:
        self.least, self.delay_s, self.min_gap_s = least, delay_s, min_gap_s
        self._release = release
        self._now = self._peak = 0
        self._next_at = 0.0  # the loop's time before which no release runs
        self._armed: asyncio.TimerHandle | None = None
        self._armed_with = 0  # the count when the release was last put off

    def count(self, in_progress: int) -> None:
        """Note the number of claims in progress now (on the event loop)."""
        self._now = in_progress
        self._peak = max(self._peak, in_progress)
        if self._armed is None and self._ended():
            self._arm(asyncio.get_running_loop())

    def _ended(self) -> bool:
        return self._peak >= self.least and self._now <= self._peak // 4

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        self._armed_with = self._now
        wait_s = max(self.delay_s, self._next_at - loop.time())
        self._armed = loop.call_later(wait_s, self._run)

    def _run(self) -> None:
        self._armed = None
        if not self._ended():
            return  # the claims are back: when these end
        loop = asyncio.get_running_loop()
        if self._now < self._armed_with:
            self._arm(loop)  # claims of the burst are still ending
            return
        began = time.thread_time()  # its own work, not the time others took the CPU
        self._release()
        took = time.thread_time() - began
        log.debug(
            "memory released after a burst of %d claims in progress at once (%.1f ms of CPU)",
            self._peak,
            took * 1e3,
        )
        self._peak = self._now
        self._next_at = loop.time() + max(self.min_gap_s, 100 * took)
