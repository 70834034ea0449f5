"""Admission: how much a queue takes in, and how fast.

``max_depth`` caps pending invocations (``on_full: reject`` refuses at once, ``block``
waits for room); ``rate_limit`` is submits per second per queue, as a token bucket whose
burst is one second's worth; ``deadline_cutoff_s`` expires work that waited too long.
All of it is arithmetic on values; the service applies it.
"""

from __future__ import annotations

from dataclasses import dataclass


def has_room(*, pending: int, incoming: int, max_depth: int | None) -> bool:
    return max_depth is None or pending + incoming <= max_depth


@dataclass
class TokenBucket:
    """``rate`` tokens a second, holding at most ``max(rate, 1)``; time is given, not read."""

    rate: float
    tokens: float = -1.0
    updated: float = 0.0

    @property
    def capacity(self) -> float:
        return max(self.rate, 1.0)

    def take(self, count: int, now: float) -> float:
        """Take ``count`` tokens: 0.0 if granted, else the seconds until they would be."""
        if self.tokens < 0:  # first use: full
            self.tokens, self.updated = self.capacity, now
        self.tokens = min(self.capacity, self.tokens + max(0.0, now - self.updated) * self.rate)
        self.updated = now
        if count <= self.tokens:
            self.tokens -= count
            return 0.0
        if count > self.capacity:  # a batch bigger than a burst: admit it once the bucket is full
            wait = (self.capacity - self.tokens) / self.rate
            if wait <= 0:
                self.tokens = 0.0
                return 0.0
            return wait
        return (count - self.tokens) / self.rate
