from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from lakeshore.domain.disciplines import boltzmann_pick, candidate_count


def draws(candidates: list[tuple[str, float]], temperature: float, n: int = 20_000) -> Counter[str]:
    rng = random.Random(1234)  # seeded: the proportions below are exact for this seed
    return Counter(boltzmann_pick(candidates, 1, temperature, rng)[0] for _ in range(n))


def test_draws_follow_exp_priority_over_temperature() -> None:
    candidates = [("a", 0.0), ("b", 1.0), ("c", 2.0)]
    counts = draws(candidates, temperature=1.0)
    weights = {name: math.exp(p) for name, p in candidates}
    total = sum(weights.values())
    for name, weight in weights.items():
        assert counts[name] / 20_000 == pytest.approx(weight / total, abs=0.015)


def test_a_low_temperature_is_priority_order() -> None:
    counts = draws([("low", 0.0), ("high", 5.0)], temperature=0.01)
    assert counts == Counter({"high": 20_000})


def test_a_high_temperature_is_nearly_uniform() -> None:
    counts = draws([("low", 0.0), ("high", 5.0)], temperature=1000.0)
    assert counts["low"] / 20_000 == pytest.approx(0.5, abs=0.02)


def test_a_batch_draws_without_replacement() -> None:
    candidates = [(str(i), float(i)) for i in range(10)]
    picked = boltzmann_pick(candidates, 10, 1.0, random.Random(7))
    assert sorted(picked, key=int) == [str(i) for i in range(10)]
    assert boltzmann_pick(candidates, 3, 1.0, random.Random(7))[:3] == picked[:3]
    assert boltzmann_pick([], 3, 1.0, random.Random(7)) == []


def test_huge_priorities_neither_overflow_nor_starve_the_top() -> None:
    picked = boltzmann_pick([("a", 1e300), ("b", -1e300)], 2, 1.0, random.Random(1))
    assert picked == ["a", "b"]


@pytest.mark.parametrize(("limit", "expected"), [(1, 64), (16, 64), (100, 400)])
def test_candidates_cover_the_claim(limit: int, expected: int) -> None:
    assert candidate_count(limit) == expected
