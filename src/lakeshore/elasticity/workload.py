"""What a simulation is fed: arrivals over time and how long each invocation runs.

Both are written as short strings, as on ``lakeshore simulate``'s command line:

Durations (``--service``, ``--boot``), in seconds; ``s``, ``m``, ``h`` suffixes allowed:
    ``fixed:10`` · ``exp:30`` (exponential, mean 30) · ``uniform:5,60`` ·
    ``lognormal:30,1`` (mean 30, sigma 1 of the underlying normal)

Arrival rates (``--arrivals``), in invocations per second (``/m`` or ``/h`` for per minute
or hour: ``constant:120/m``):
    ``constant:R`` — Poisson arrivals at rate R
    ``steps:R0,T1=R1,T2=R2,…`` — R0 from the start, R1 from T1 on, …
    ``bursts:R,EVERY,SIZE`` — Poisson at R, plus SIZE invocations at once every EVERY
    ``daily:MEAN,PEAK[,PEAK_AT]`` — a day-long cosine between ``2·MEAN - PEAK`` (not below
    0) and PEAK, at its peak at PEAK_AT (default 14h)

Everything draws from the ``random.Random`` it is given, so a seed fixes the workload.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

DAY_S: Final = 86_400.0
_UNITS: Final = {"s": 1.0, "m": 60.0, "h": 3_600.0, "d": DAY_S}


class WorkloadError(ValueError):
    """A workload or distribution string that cannot be read; says what is wrong."""


def seconds(text: str) -> float:
    """``90``, ``90s``, ``1.5m``, ``2h``, ``1d`` → seconds."""
    text = text.strip()
    unit = _UNITS.get(text[-1:]) if text else None
    number = text[:-1] if unit else text
    try:
        value = float(number) * (unit or 1.0)
    except ValueError:
        raise WorkloadError(f"not a duration: {text!r} (e.g. 30, 30s, 5m, 2h)") from None
    if not math.isfinite(value) or value < 0:
        raise WorkloadError(f"not a duration: {text!r} (a number >= 0)")
    return value


def rate(text: str) -> float:
    """``2``, ``120/m``, ``7200/h`` → per second."""
    number, _, per = text.strip().partition("/")
    try:
        value = float(number) / (_UNITS[per] if per else 1.0)
    except (ValueError, KeyError):
        raise WorkloadError(f"not a rate: {text!r} (e.g. 2, 120/m, 7200/h)") from None
    if not math.isfinite(value) or value < 0:
        raise WorkloadError(f"not a rate: {text!r} (a number >= 0)")
    return value


@dataclass(frozen=True)
class Dist:
    """A distribution of durations, in seconds."""

    kind: str  # fixed | exp | uniform | lognormal
    a: float
    b: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Dist:
        kind, _, args = text.partition(":")
        parts = [p for p in args.split(",") if p.strip()]
        shapes = {"fixed": 1, "exp": 1, "uniform": 2, "lognormal": 2}
        if kind not in shapes or len(parts) != shapes[kind]:
            raise WorkloadError(
                f"not a distribution: {text!r} (fixed:S, exp:MEAN, uniform:LO,HI, "
                "lognormal:MEAN,SIGMA)"
            )
        if kind == "lognormal":
            return cls(kind, seconds(parts[0]), float(parts[1]))
        values = [seconds(p) for p in parts]
        if kind == "uniform" and values[1] < values[0]:
            raise WorkloadError(f"uniform:{args}: the upper bound is below the lower")
        return cls(kind, *values)

    @property
    def mean(self) -> float:
        if self.kind == "uniform":
            return (self.a + self.b) / 2
        return self.a

    def draw(self, rng: random.Random) -> float:
        if self.kind == "fixed":
            return self.a
        if self.kind == "exp":
            return rng.expovariate(1 / self.a) if self.a > 0 else 0.0
        if self.kind == "uniform":
            return rng.uniform(self.a, self.b)
        # lognormal with the given mean: mu = ln(mean) - sigma^2 / 2
        mu = math.log(self.a) - self.b**2 / 2 if self.a > 0 else 0.0
        return rng.lognormvariate(mu, self.b) if self.a > 0 else 0.0


@dataclass(frozen=True)
class Arrivals:
    """An arrival rate over time (Poisson), with optional batches at fixed times."""

    kind: str
    steps: tuple[tuple[float, float], ...] = ()  # (from second, rate) for constant/steps
    mean: float = 0.0  # daily
    peak: float = 0.0  # daily
    peak_at: float = 14 * 3_600.0  # daily
    every: float = 0.0  # bursts
    size: int = 0  # bursts

    @classmethod
    def parse(cls, text: str) -> Arrivals:
        kind, _, args = text.partition(":")
        parts = [p.strip() for p in args.split(",") if p.strip()]
        reader = _READERS.get(kind)
        found = reader(parts) if reader is not None else None
        if found is None:
            raise WorkloadError(
                f"not an arrival pattern: {text!r} (constant:R, steps:R0,T1=R1,…, "
                "bursts:R,EVERY,SIZE, daily:MEAN,PEAK[,PEAK_AT])"
            )
        return found

    def rate_at(self, t: float) -> float:
        """The Poisson rate (per second) at ``t`` seconds from the start."""
        if self.kind == "daily":
            swing = self.peak - self.mean
            return max(0.0, self.mean + swing * math.cos(2 * math.pi * (t - self.peak_at) / DAY_S))
        current = 0.0
        for start, value in self.steps:
            if t >= start:
                current = value
        return current

    @property
    def highest(self) -> float:
        if self.kind == "daily":
            return self.peak
        return max((value for _, value in self.steps), default=0.0)

    def most(self, duration_s: float) -> float:
        """An upper bound of the invocations ``duration_s`` brings (to refuse a workload
        too large to play before drawing it)."""
        batches = int(duration_s / self.every) * self.size if self.kind == "bursts" else 0
        return self.highest * duration_s + batches

    def times(self, duration_s: float, rng: random.Random) -> list[float]:
        """Arrival instants in ``[0, duration_s)``, sorted (thinning against the top rate)."""
        out: list[float] = []
        top = self.highest
        if top > 0:
            t = 0.0
            while True:
                t += rng.expovariate(top)
                if t >= duration_s:
                    break
                if rng.random() * top <= self.rate_at(t):
                    out.append(t)
        if self.kind == "bursts" and self.size > 0:
            k = 1
            while k * self.every < duration_s:
                out.extend([k * self.every] * self.size)
                k += 1
            out.sort()
        return out


def synthetic(
    arrivals: Arrivals, service: Dist, duration_s: float, rng: random.Random
) -> list[tuple[float, float]]:
    """(submit second, run seconds) of each invocation, in submit order."""
    return [(t, service.draw(rng)) for t in arrivals.times(duration_s, rng)]


def replayed(
    history: Sequence[tuple[float, float | None]], service: Dist, rng: random.Random
) -> list[tuple[float, float]]:
    """A server's history as a workload: (submit second, run seconds or ``None`` when
    unknown — not finished, or never started) → the run seconds known, else one drawn from
    ``service``; in submit order."""
    ordered = sorted(history, key=lambda item: item[0])
    return [(t, run_s if run_s is not None else service.draw(rng)) for t, run_s in ordered]


def _constant(parts: list[str]) -> Arrivals | None:
    return Arrivals("constant", steps=((0.0, rate(parts[0])),)) if len(parts) == 1 else None


def _steps(parts: list[str]) -> Arrivals | None:
    if not parts:
        return None
    steps = [(0.0, rate(parts[0]))]
    for part in parts[1:]:
        at, sep, value = part.partition("=")
        if not sep:
            raise WorkloadError(f"steps: {part!r} is not TIME=RATE (e.g. 1h=5)")
        steps.append((seconds(at), rate(value)))
    if any(b[0] <= a[0] for a, b in itertools.pairwise(steps)):
        raise WorkloadError("steps: the times must increase")
    return Arrivals("steps", steps=tuple(steps))


def _bursts(parts: list[str]) -> Arrivals | None:
    if len(parts) != 3:
        return None
    every = seconds(parts[1])
    if every <= 0:
        raise WorkloadError("bursts: EVERY must be > 0")
    try:
        size = int(parts[2])
    except ValueError:
        raise WorkloadError(f"bursts: SIZE {parts[2]!r} is not a whole number") from None
    return Arrivals("bursts", steps=((0.0, rate(parts[0])),), every=every, size=size)


def _daily(parts: list[str]) -> Arrivals | None:
    if len(parts) not in (2, 3):
        return None
    mean, peak = rate(parts[0]), rate(parts[1])
    if peak < mean:
        raise WorkloadError("daily: PEAK must be >= MEAN")
    peak_at = seconds(parts[2]) if len(parts) == 3 else 14 * 3_600.0
    return Arrivals("daily", mean=mean, peak=peak, peak_at=peak_at)


_READERS: Final[dict[str, Callable[[list[str]], Arrivals | None]]] = {
    "constant": _constant,
    "steps": _steps,
    "bursts": _bursts,
    "daily": _daily,
}
