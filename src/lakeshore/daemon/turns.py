"""The daemon's slots, given in turns by concurrency key.

A daemon holds more than it runs (prefetch), and the server hands out a keyed queue's
work in turns (the first of each key, then the second…). If the daemon then started what
it holds in the order it came, a key that flooded the queue would still run ahead of a
key that sent one: its invocation waits behind every earlier one the daemon holds. So a
freed slot goes to the next key in turn among the invocations waiting for one (those
without a key are one key of their own), each key's in the order they came; with no key
at all it is first come, first served, as a semaphore would serve them.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Hashable


class Turns:
    """``capacity`` slots: :meth:`acquire` waits for one (a cancel ends the wait and
    gives back a slot it was just handed), :meth:`release` hands it to the next key in
    turn, or frees it."""

    def __init__(self, capacity: int) -> None:
        self.free = capacity
        self._waiting: dict[Hashable, collections.deque[asyncio.Future[None]]] = {}
        self._order: collections.deque[Hashable] = collections.deque()  # keys in turn

    async def acquire(self, key: Hashable = None) -> None:
        if self.free > 0 and not self._order:
            self.free -= 1
            return
        handed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        line = self._waiting.get(key)
        if line is None:
            line = self._waiting[key] = collections.deque()
            self._order.append(key)
        line.append(handed)
        try:
            await handed
        except asyncio.CancelledError:
            if handed.done() and not handed.cancelled():  # handed its slot as it was cancelled
                self.release()
            else:
                self._forget(key, handed)
            raise

    def release(self) -> None:
        while self._order:
            key = self._order.popleft()
            line = self._waiting[key]
            handed = line.popleft()
            if line:
                self._order.append(key)  # its next waits for the other keys' turns
            else:
                del self._waiting[key]
            if not handed.done():
                handed.set_result(None)
                return
        self.free += 1

    def _forget(self, key: Hashable, handed: asyncio.Future[None]) -> None:
        line = self._waiting.get(key)
        if line is None or handed not in line:
            return
        line.remove(handed)
        if not line:
            del self._waiting[key]
            self._order.remove(key)
