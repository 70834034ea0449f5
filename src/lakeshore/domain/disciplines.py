"""Dispatch order for the ``boltzmann`` discipline: priority-weighted random sampling.

Each candidate is drawn with probability proportional to ``exp(priority / temperature)``
(without replacement, for batch claims). A low temperature approaches strict priority
order; a high one approaches a uniform draw among the candidates. The candidates are the
top ``max(64, 4 * claim size)`` pending invocations by priority (one indexed read, not the
whole backlog): lower priorities among them are served too, while one behind a larger
backlog of higher priorities waits until it is among the candidates.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Final

DEFAULT_TEMPERATURE: Final = 1.0
CANDIDATES_PER_CLAIM: Final = 4  # sample among this many times the claim size (at least 64)
MIN_CANDIDATES: Final = 64


def candidate_count(limit: int) -> int:
    return max(MIN_CANDIDATES, limit * CANDIDATES_PER_CLAIM)


def boltzmann_pick(
    candidates: Sequence[tuple[str, float]],
    k: int,
    temperature: float | None,
    rng: random.Random,
) -> list[str]:
    """Draw up to ``k`` ids from ``(id, priority)`` pairs, weight ``exp(priority / T)``."""
    t = temperature if temperature and temperature > 0 else DEFAULT_TEMPERATURE
    pool = list(candidates)
    picked: list[str] = []
    if not pool:
        return picked
    top = max(priority for _, priority in pool)
    weights = [math.exp((priority - top) / t) for _, priority in pool]  # shifted: no overflow
    while pool and len(picked) < k:
        total = sum(weights)
        if total <= 0:  # every weight underflowed but the best: take in order
            index = 0
        else:
            point = rng.random() * total
            index, acc = 0, weights[0]
            while acc < point and index < len(weights) - 1:
                index += 1
                acc += weights[index]
        picked.append(pool.pop(index)[0])
        weights.pop(index)
    return picked
