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


CANDIDATES = [(str(i), float(i % 3)) for i in range(10)]


@pytest.mark.parametrize(("k", "count"), [(0, 0), (1, 1), (3, 3), (9, 9), (10, 10), (25, 10)])
def test_a_claim_draws_exactly_its_limit_or_every_candidate(k: int, count: int) -> None:
    picked = boltzmann_pick(CANDIDATES, k, 1.0, random.Random(3))
    assert len(picked) == count
    assert len(set(picked)) == count


def test_fewer_candidates_than_the_limit_are_all_drawn() -> None:
    picked = boltzmann_pick([("a", 0.0), ("b", 9.0), ("c", -3.0)], 5, 1.0, random.Random(3))
    assert sorted(picked) == ["a", "b", "c"]


@pytest.mark.parametrize("temperature", [None, 0.0, -1.0, -50.0])
def test_an_unset_or_non_positive_temperature_draws_as_the_default(
    temperature: float | None,
) -> None:
    candidates = [("low", 0.0), ("mid", 1.0), ("high", 2.0)]
    for seed in range(20):
        expected = boltzmann_pick(candidates, 2, 1.0, random.Random(seed))
        assert boltzmann_pick(candidates, 2, temperature, random.Random(seed)) == expected


class FixedDraw(random.Random):
    """A random source that always draws ``point`` (a fraction of the total weight)."""

    def __init__(self, point: float) -> None:
        super().__init__(0)
        self.point = point

    def random(self) -> float:
        return self.point


@pytest.mark.parametrize(
    ("point", "first"),
    [(0.0, "a"), (0.2, "a"), (0.25, "a"), (0.26, "b"), (0.5, "b"), (0.51, "c"), (0.99, "d")],
)
def test_a_draw_walks_the_candidates_in_order_of_their_cumulative_weight(
    point: float, first: str
) -> None:
    equal = [("a", 0.0), ("b", 0.0), ("c", 0.0), ("d", 0.0)]  # a quarter of the weight each
    assert boltzmann_pick(equal, 1, 1.0, FixedDraw(point)) == [first]
