"""What ``wait_target`` learns from a scope's own history, and how fast.

One rule, fed by the store (the tick, ``stats``, ``explain``) and by the simulator's
model alike, so both learn the same way:

- **service time**: the mean start → finish of the scope's invocations finished in the
  last :data:`SERVICE_WINDOW_S` (at most the latest :data:`SERVICE_SAMPLES`); learned
  from :data:`MIN_SERVICE_SAMPLES` on, the policy's ``service_s`` hint before, else the
  few there are, else the default;
- **boot time**: the mean request → hello of the scope's latest :data:`BOOT_SAMPLES`
  launches that said hello (through its provider, from its daemon template); learned
  from the first, before that the policy's ``boot_s`` hint, else the ``boot_s``
  configured on the scope's provider, else the default;
- **arrival rate**: the submits of each of the last :data:`ARRIVAL_MINUTES` minutes,
  averaged, a burst's minutes left out (a burst is backlog, which the rule drains on its
  own, not a rate to keep a fleet for); on a rise (a least-squares slope over a deviation
  of noise), the line carried a boot ahead.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from lakeshore.domain.scaling import Policy
from lakeshore.domain.wait_target import DEFAULT_BOOT_S, DEFAULT_SERVICE_S, Demand, Estimate

SERVICE_WINDOW_S: Final = 1_800.0
SERVICE_SAMPLES: Final = 500
MIN_SERVICE_SAMPLES: Final = 3
BOOT_SAMPLES: Final = 20
ARRIVAL_MINUTES: Final = 20
BURST_SHARE: Final = 0.1  # at most this share of minutes is left out as bursts
TREND_SIGMAS: Final = 1.0  # a rise is followed once its slope is this many deviations
MAX_CONFIGURED_BOOT_S: Final = 86_400.0  # a provider's ``boot_s``: at most a day
SHORTEST_S: Final = 0.1  # a learned time is at least this: runs that took no time at all


@dataclass(frozen=True)
class History:
    """A scope's recent history, as read: service times and boot times (seconds, newest
    first), submits per minute (the last :data:`ARRIVAL_MINUTES`, any order), delayed
    invocations due within a boot, and how long each idle daemon has been idle; and the
    boot time configured on the scope's provider (``None``: none), a boot's estimate
    before there is a learned one."""

    service_s: Sequence[float] = ()
    boot_s: Sequence[float] = ()
    per_minute: Sequence[int] = ()
    due_soon: int = 0
    idle_for: Mapping[str, float] = field(default_factory=dict)
    provider_boot_s: float | None = None


def _mean(samples: Sequence[float]) -> float:
    """The mean, never under :data:`SHORTEST_S` (the rule divides by it)."""
    return max(SHORTEST_S, math.fsum(samples) / len(samples))


def service_of(policy: Policy, samples: Sequence[float]) -> Estimate:
    if len(samples) >= MIN_SERVICE_SAMPLES or (samples and policy.service_s is None):
        return Estimate(_mean(samples), "learned", len(samples))
    if policy.service_s is not None:
        return Estimate(policy.service_s, "hint")
    return Estimate(DEFAULT_SERVICE_S, "default")


def boot_of(policy: Policy, samples: Sequence[float], provider_s: float | None = None) -> Estimate:
    """The boot time: learned from the first sample; before, the policy's ``boot_s``
    hint, else the ``boot_s`` configured on the scope's provider (``provider_s``), else
    the default."""
    if samples:
        return Estimate(_mean(samples), "learned", len(samples))
    if policy.boot_s is not None:
        return Estimate(policy.boot_s, "hint")
    if provider_s is not None:
        return Estimate(provider_s, "provider")
    return Estimate(DEFAULT_BOOT_S, "default")


def configured_boot_s(config: object) -> float | None:
    """The ``boot_s`` of a provider registration's stored config: a number of seconds,
    over 0 and at most :data:`MAX_CONFIGURED_BOOT_S` (as its kind validated it), else
    ``None``."""
    value = config.get("boot_s") if isinstance(config, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value) or not 0 < value <= MAX_CONFIGURED_BOOT_S:
        return None
    return float(value)


def arrivals_of(per_minute: Sequence[int], ahead_s: float = 0.0) -> Estimate:
    """Submits a second: the minutes' counts (newest first), a burst's minutes left out
    (a count no Poisson rate near the median's would bring: over ``median +
    3·sqrt(median) + 3``, in at most a tenth of the minutes — more is the rate moving),
    averaged; or, when it rises by more than noise, their least-squares line carried
    ``ahead_s`` on (a boot: the rate the fleet launched now will meet)."""
    if not per_minute:
        return Estimate(0.0, "learned", 0)
    ordered = sorted(per_minute)
    median = ordered[len(ordered) // 2]
    bound = median + 3 * math.sqrt(median) + 3
    outliers = sum(1 for n in per_minute if n > bound)
    if outliers > len(per_minute) * BURST_SHARE:  # not a burst: the rate moved
        bound = math.inf
    kept = [(-i - 0.5, n) for i, n in enumerate(per_minute) if n <= bound]
    mean = sum(n for _, n in kept) / len(kept)
    rate = mean
    if len(kept) > 2:
        x_mean = sum(x for x, _ in kept) / len(kept)
        spread = sum((x - x_mean) ** 2 for x, _ in kept)
        slope = sum((x - x_mean) * (n - mean) for x, n in kept) / spread
        if slope > TREND_SIGMAS * math.sqrt(max(mean, 1.0) / spread):  # more than noise
            rate = max(mean, mean + slope * (ahead_s / 60.0 - x_mean))
    return Estimate(rate / 60.0, "learned", len(per_minute))


def demand(policy: Policy, history: History) -> Demand:
    """The estimates ``wait_target`` decides from."""
    boot = boot_of(policy, history.boot_s, history.provider_boot_s)
    return Demand(
        service=service_of(policy, history.service_s),
        boot=boot,
        arrivals=arrivals_of(history.per_minute, boot.value),
        due_soon=history.due_soon,
        idle_for=history.idle_for,
    )
