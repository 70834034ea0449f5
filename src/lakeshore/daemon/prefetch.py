"""How many invocations a daemon claims ahead of its free slots, learned as it runs.

A slot that frees waits a report's round trip for its next invocation unless one was
claimed ahead (prefetched). Claiming ahead pays for invocations that are short next to
that round trip — during one trip each slot would run ``trip / run`` of them — and costs
for long ones: what one daemon holds waiting, another idle daemon cannot take. So the
daemon keeps an average of its invocations' run time and of its reports' round trip
(exponentially weighted, :data:`WEIGHT` to the newest) and holds ahead

    ``min(CEILING, floor(HEADROOM * capacity * trip / run))``

— hundreds for a stream of tiny invocations, 0 once an invocation takes longer than
``HEADROOM * capacity`` round trips (a few tenths of a second on a local network), and 0
before it has run anything. ``lakeshore daemon run --prefetch N`` fixes it at ``N``.
Pure: the daemon hands it each duration it measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

CEILING: Final = 1_000  # the most held ahead, and what the daemon's hello declares
HEADROOM: Final = 4.0  # round trips' worth of work held ahead per slot
WEIGHT: Final = 0.2  # of the newest measure in each average


@dataclass
class Prefetch:
    """The prefetch of a daemon with ``capacity`` slots: ``fixed`` when given (the
    ``--prefetch`` override), else learned from :meth:`ran` and :meth:`tripped`."""

    capacity: int
    fixed: int | None = None
    run_s: float | None = None  # the average invocation's run
    trip_s: float | None = None  # the average report's round trip

    @property
    def declared(self) -> int:
        """The most it may ever hold ahead: what the daemon's hello tells the server."""
        return CEILING if self.fixed is None else self.fixed

    @property
    def value(self) -> int:
        """How many to hold ahead now."""
        if self.fixed is not None:
            return self.fixed
        if self.run_s is None or self.trip_s is None:
            return 0
        ahead = HEADROOM * self.capacity * self.trip_s / max(self.run_s, 1e-6)
        return min(CEILING, int(ahead))

    def ran(self, seconds: float) -> None:
        """An invocation ran this long (its slot taken until its outcome was known)."""
        self.run_s = _averaged(self.run_s, max(0.0, seconds))

    def tripped(self, seconds: float) -> None:
        """A report's request was answered after this long."""
        self.trip_s = _averaged(self.trip_s, max(0.0, seconds))


def _averaged(average: float | None, newest: float) -> float:
    return newest if average is None else average + WEIGHT * (newest - average)
