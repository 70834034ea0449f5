"""The floor no policy can beat, and how often a policy met its wait target.

**The hindsight baseline**: for each hour of the workload, the smallest fixed fleet that
would have met the target for that hour's arrivals — knowing them in advance, started
empty and ready at the hour's start (no boot), paid for that hour only (no waste). Its
daemon-hours are a floor: a policy that must boot its daemons and cannot see the future
spends more. Each policy's daemon-hours over the floor says how close it came.

**Windows met**: the workload's time cut in :data:`WINDOW_S` windows; a window meets the
target when the p95 wait of the invocations submitted in it is at or under the target
(a window with no submit is left out). A policy is compared with the baseline on the
windows where the baseline meets the target.

Pure: the workload and the waits in, numbers out.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

WINDOW_S: Final = 300.0
HOUR_S: Final = 3_600.0


@dataclass(frozen=True)
class Baseline:
    """The hindsight fleet: daemons per hour, their daemon-hours, and the windows (by
    index) where it meets the target."""

    fleet: tuple[int, ...]
    daemon_hours: float
    met: frozenset[int]
    windows: int  # windows with a submit


def waits_of(work: Sequence[tuple[float, float]], servers: int) -> list[float]:
    """The waits of ``work`` ((submit, run seconds), in submit order) on ``servers``
    first-come-first-served slots free at the start."""
    free = [0.0] * servers
    waits = []
    for submit, run_s in work:
        soonest = heapq.heappop(free)
        start = max(submit, soonest)
        waits.append(start - submit)
        heapq.heappush(free, start + run_s)
    return waits


def p95(values: Iterable[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def smallest_fleet(work: Sequence[tuple[float, float]], target_s: float, slots: int) -> int:
    """The fewest daemons (of ``slots`` each) whose p95 wait on ``work`` meets the target."""
    if not work:
        return 0
    hi = -(-len(work) // slots)  # a slot for every invocation: nobody waits
    lo = 1
    while lo < hi:
        mid = (lo + hi) // 2
        if p95(waits_of(work, mid * slots)) <= target_s:
            hi = mid
        else:
            lo = mid + 1
    return lo


def windows_met(started: Iterable[tuple[float, float]], target_s: float) -> dict[int, bool]:
    """Per window with a submit (by index): whether its p95 wait met the target."""
    by_window: dict[int, list[float]] = defaultdict(list)
    for submit, wait in started:
        by_window[int(submit // WINDOW_S)].append(wait)
    return {w: p95(waits) <= target_s for w, waits in by_window.items()}


def baseline(
    work: Sequence[tuple[float, float]], target_s: float, duration_s: float, slots: int = 1
) -> Baseline:
    """The hindsight baseline of ``work`` over ``duration_s``."""
    hours = max(1, math.ceil(duration_s / HOUR_S))
    by_hour: list[list[tuple[float, float]]] = [[] for _ in range(hours)]
    for submit, run_s in work:
        if submit < duration_s:
            by_hour[int(submit // HOUR_S)].append((submit, run_s))
    fleet = []
    started: list[tuple[float, float]] = []
    for hour, part in enumerate(by_hour):
        size = smallest_fleet(part, target_s, slots)
        fleet.append(size)
        if part:
            shifted = [(submit - hour * HOUR_S, run_s) for submit, run_s in part]
            waits = waits_of(shifted, size * slots)
            started += [(submit, wait) for (submit, _), wait in zip(part, waits, strict=True)]
    met = windows_met(started, target_s)
    return Baseline(
        fleet=tuple(fleet),
        daemon_hours=math.fsum(
            size * min(1.0, (duration_s - h * HOUR_S) / HOUR_S) for h, size in enumerate(fleet)
        ),
        met=frozenset(w for w, ok in met.items() if ok),
        windows=len(met),
    )


@dataclass(frozen=True)
class Score:
    """A policy against the target and the baseline."""

    windows_met: float  # of the windows with a submit, the share whose p95 met the target
    met_where_baseline_met: float  # the same, of the windows where the baseline met it
    over_floor: float  # daemon-hours / the baseline's (inf when the baseline needs none)


def score(
    started: Iterable[tuple[float, float]], daemon_hours: float, target_s: float, floor: Baseline
) -> Score:
    met = windows_met(started, target_s)
    met_all = sum(met.values()) / len(met) if met else 1.0
    judged = [met.get(w, True) for w in floor.met]
    met_there = sum(judged) / len(judged) if judged else 1.0
    ratio = daemon_hours / floor.daemon_hours if floor.daemon_hours else math.inf
    return Score(windows_met=met_all, met_where_baseline_met=met_there, over_floor=ratio)
