"""Waking waiting claims the moment work arrives, instead of on their next poll.

A claim registers interest in its queues *before* it looks for work, so a submit that
lands between the look and the wait still wakes it. This is the in-process half;
across server replicas PostgreSQL ``LISTEN/NOTIFY`` feeds the same ``notify``
(``lakeshore.store.wakeups``). Keys are queue ids (work to claim) and ``stream:<id>``
(an invocation's stream grew or ended).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager


class Notifier:
    def __init__(self) -> None:
        self._waiters: defaultdict[str, set[asyncio.Event]] = defaultdict(set)
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
    def listen(
        self, queue_ids: Iterable[str], event: asyncio.Event | None = None
    ) -> Iterator[asyncio.Event]:
        """Set ``event`` (a new one unless given) on every notify of these keys while
        inside."""
        event = asyncio.Event() if event is None else event
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


class Hangup:
    """Set once a waiting claim's caller is gone (it hung up, or the server is
    stopping). Setting it also rings ``bell``, which the claim's notifier wake-ups and
    hand-off ring too: a waiting claim waits on that one event, with no task of its own
    (a server holding many waiting claims keeps few objects for each:
    ``bench/longpoll_memory.py``)."""

    __slots__ = ("_set", "bell")

    def __init__(self) -> None:
        self._set = False
        self.bell = asyncio.Event()

    def set(self) -> None:
        self._set = True
        self.bell.set()

    def is_set(self) -> bool:
        return self._set


async def wait_one(event: asyncio.Event, seconds: float) -> None:
    """Until ``event`` is set, at most ``seconds``; no task is made for it."""
    if event.is_set() or seconds <= 0:
        return
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()


async def wait_any(events: list[asyncio.Event], seconds: float) -> None:
    """Until one of ``events`` is set, at most ``seconds``."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
