"""The simulator's queueing model against queueing theory, and its determinism."""

from __future__ import annotations

import json
import math
import random

import pytest

from lakeshore.domain.queue import QueueSpec
from lakeshore.elasticity.simulate import Fleet, Report, SimulationError, simulate
from lakeshore.elasticity.workload import Arrivals, Dist, WorkloadError, synthetic


def erlang_c(c: int, a: float) -> float:
    """The probability that an arrival waits in an M/M/c queue with offered load a."""
    rho = a / c
    top = a**c / math.factorial(c) / (1 - rho)
    return top / (sum(a**k / math.factorial(k) for k in range(c)) + top)


@pytest.mark.parametrize("rho", [0.5, 0.8, 0.9])
def test_a_fixed_fleet_waits_as_erlang_c_says(rho: float) -> None:
    """c daemons of one slot, Poisson arrivals, exponential service (mean 1 s): over
    200,000 invocations the mean wait is within 5 % of Erlang C and the p95 within 10 %."""
    c, mu, n = 4, 1.0, 200_000
    lam = rho * c * mu
    rng = random.Random(20261204)
    t, work = 0.0, []
    for _ in range(n):
        t += rng.expovariate(lam)
        work.append((t, rng.expovariate(mu)))
    spec = QueueSpec.model_validate({"name": "mmc"})  # fixed: the fleet never moves
    report = simulate(spec, work, Fleet(initial=c, interval_s=60.0), duration_s=t + 3_600, rng=rng)
    assert report.served == n and report.unfinished == 0
    assert report.launches == report.kills == 0
    p_wait = erlang_c(c, lam / mu)
    mean_wait = p_wait / (c * mu - lam)
    p95 = max(0.0, math.log(p_wait / 0.05) / (c * mu - lam))  # P(W > t) = C e^-(cμ-λ)t
    assert report.wait_mean_s == pytest.approx(mean_wait, rel=0.05)
    if p95 > 0:
        assert report.wait_p95_s == pytest.approx(p95, rel=0.10)
    else:
        assert report.wait_p95_s == 0.0


def bursty_day(seed: int) -> tuple[list[tuple[float, float]], random.Random]:
    rng = random.Random(seed)
    arrivals = Arrivals.parse("bursts:0.05,2h,400")
    return synthetic(arrivals, Dist.parse("exp:20"), 86_400, rng), rng


def test_the_same_seed_gives_the_same_report_byte_for_byte() -> None:
    spec = QueueSpec.model_validate(
        {"name": "gpu", "elasticity": {"kind": "fully_elastic", "min": 0, "max": 20}}
    )

    def run() -> str:
        work, rng = bursty_day(7)
        report = simulate(
            spec, work, Fleet(boot=Dist.parse("uniform:20,60")), duration_s=86_400, rng=rng
        )
        return json.dumps(report.summary(), sort_keys=True)

    first = run()
    assert first == run()
    summary = json.loads(first)
    assert summary["launches"] > 0 and summary["kills"] > 0  # the bursts move the fleet
    assert summary["peak_daemons"] <= 20  # never past max
    assert summary["ticks"] == 86_400 // 5


def test_a_pool_with_min_keeps_min_warm_and_a_burst_scales_it_up() -> None:
    spec = QueueSpec.model_validate(
        {"name": "warm", "elasticity": {"kind": "pool_with_threshold", "min": 2, "max": 6}}
    )
    work, rng = bursty_day(3)
    report = simulate(spec, work, Fleet(initial=0), duration_s=86_400, rng=rng)
    first = report.decisions[0]
    assert first["action"] == "scale_up" and first["rule"] == "pool_with_threshold.below_min"
    assert 2 < report.peak_daemons <= 6
    assert any(d["repeats"] > 1 for d in report.decisions)  # steady no-ops are folded


def test_cost_counts_booting_daemons_and_the_cost_weight() -> None:
    spec = QueueSpec.model_validate({"name": "f"})
    report = simulate(
        spec, [], Fleet(initial=3, cost_per_hour=2.5), duration_s=7_200, rng=random.Random(1)
    )
    assert report.daemon_hours == pytest.approx(6.0)
    assert report.cost == pytest.approx(15.0)


def test_a_custom_scaler_is_refused_with_its_reason() -> None:
    spec = QueueSpec.model_validate({"name": "c", "customScalerUdf": "mod:fn"})
    with pytest.raises(SimulationError, match="customScalerUdf"):
        simulate(spec, [], Fleet(), duration_s=60, rng=random.Random(1))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("poisson:3", "not an arrival pattern"),
        ("steps:1,2h=3,1h=4", "times must increase"),
        ("bursts:1,0,5", "EVERY must be > 0"),
        ("daily:5,2", "PEAK must be >= MEAN"),
        ("constant:fast", "not a rate"),
    ],
)
def test_bad_arrival_patterns_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(WorkloadError, match=message):
        Arrivals.parse(text)


def test_rates_and_distributions_read_their_units() -> None:
    assert Arrivals.parse("constant:120/m").rate_at(0) == 2.0
    steps = Arrivals.parse("steps:1,1h=5")
    assert (steps.rate_at(3_599), steps.rate_at(3_600)) == (1.0, 5.0)
    daily = Arrivals.parse("daily:2,6,14h")
    assert daily.rate_at(14 * 3_600) == pytest.approx(6.0)
    assert daily.rate_at(2 * 3_600) == pytest.approx(0.0, abs=1e-9)  # 2·2 - 6 < 0 → 0
    assert Dist.parse("uniform:1m,2m").mean == 90.0
    with pytest.raises(WorkloadError, match="not a distribution"):
        Dist.parse("normal:3")


def test_a_drain_runs_on_until_the_work_submitted_is_done() -> None:
    spec = QueueSpec.model_validate(
        {"name": "late", "elasticity": {"kind": "fully_elastic", "min": 0, "max": 2}}
    )
    work = [(595.0, 40.0), (596.0, 40.0), (597.0, 40.0)]  # just before the end

    def run(drain: bool) -> Report:
        fleet = Fleet(boot=Dist.parse("fixed:30"))
        return simulate(spec, work, fleet, duration_s=600, rng=random.Random(1), drain=drain)

    cut, drained = run(False), run(True)
    assert (cut.served, cut.unfinished, cut.ended_s) == (0, 3, 600.0)
    assert (drained.served, drained.unfinished) == (3, 0)
    assert 600 < drained.ended_s <= 1_200  # it ends once the work is done


def test_thrash_and_relaunches_are_counted() -> None:
    """One short invocation, then another: each wakes a daemon that is killed the tick
    after it is done, so each kill comes within the hysteresis window (2 ticks) of its
    launch (thrash), and the second launch comes soon after the first kill (relaunch)."""
    spec = QueueSpec.model_validate(
        {"name": "flappy", "elasticity": {"kind": "fully_elastic", "min": 0, "max": 1}}
    )
    work = [(1.0, 0.5), (21.0, 0.5)]
    fleet = Fleet(boot=Dist.parse("fixed:1"))
    report = simulate(spec, work, fleet, duration_s=60, rng=random.Random(1))
    assert (report.launches, report.kills) == (2, 2)
    assert (report.thrash, report.relaunches) == (2, 1)
    assert report.unserved_demand_s == pytest.approx((5 + 1 - 1) + (25 + 1 - 21))
