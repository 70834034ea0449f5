"""The boot time's estimate: learned from the scope's launches once there is one, before
that the policy's hint, else its provider's configured ``boot_s``, else the default."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from lakeshore.domain.queue import parse_spec
from lakeshore.domain.scaling import Policy
from lakeshore.domain.wait_target import DEFAULT_BOOT_S
from lakeshore.elasticity import estimates, plan
from lakeshore.elasticity.estimates import History
from lakeshore.elasticity.simulate import Fleet, simulate
from lakeshore.providers import base

HINTED = Policy("wait_target", wait_s=60, boot_s=90.0)
UNHINTED = Policy("wait_target", wait_s=60)


@pytest.mark.parametrize(
    ("policy", "samples", "provider_s", "expected"),
    [
        (UNHINTED, [], None, (DEFAULT_BOOT_S, "default", 0)),
        (UNHINTED, [], 120.0, (120.0, "provider", 0)),
        (HINTED, [], None, (90.0, "hint", 0)),
        (HINTED, [], 120.0, (90.0, "hint", 0)),  # the policy's hint before the provider's
        (UNHINTED, [40.0], 120.0, (40.0, "learned", 1)),  # learned from the first sample
        (HINTED, [40.0, 60.0], 120.0, (50.0, "learned", 2)),
        (HINTED, [30.0, 50.0, 70.0], None, (50.0, "learned", 3)),
    ],
)
def test_boot_of_prefers_learned_then_hint_then_provider_then_default(
    policy: Policy,
    samples: list[float],
    provider_s: float | None,
    expected: tuple[float, str, int],
) -> None:
    est = estimates.boot_of(policy, samples, provider_s)
    assert (est.value, est.source, est.samples) == expected


def test_the_demand_reads_the_provider_s_boot_from_the_history() -> None:
    boot = estimates.demand(UNHINTED, History(provider_boot_s=120.0)).boot
    assert (boot.value, boot.source) == (120.0, "provider")
    assert estimates.demand(UNHINTED, History()).boot.source == "default"
    learned = estimates.demand(UNHINTED, History(boot_s=[75.0], provider_boot_s=120.0)).boot
    assert (learned.value, learned.source) == (75.0, "learned")


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"boot_s": 120.0}, 120.0),
        ({"boot_s": 120}, 120.0),
        ({"boot_s": 86_400}, 86_400.0),
        ({}, None),
        ({"boot_s": None}, None),
        ({"boot_s": 0}, None),
        ({"boot_s": -5}, None),
        ({"boot_s": 86_401}, None),
        ({"boot_s": math.inf}, None),
        ({"boot_s": math.nan}, None),
        ({"boot_s": True}, None),
        ({"boot_s": "120"}, None),
        (None, None),
        ([], None),
    ],
)
def test_a_registration_s_boot_s_is_read_only_when_it_is_a_valid_time(
    config: object, expected: float | None
) -> None:
    assert estimates.configured_boot_s(config) == expected


@pytest.mark.parametrize("kind", ["fake", "local", "ec2", "gce", "kube"])
def test_every_launching_kind_takes_an_optional_boot_s(kind: str) -> None:
    field = base.KINDS[kind].config.model_fields["boot_s"]
    assert field.default is None
    assert not field.is_required()


@pytest.mark.parametrize(
    ("value", "accepted"),
    [(120, True), (0.5, True), (86_400, True), (0, False), (-1, False), (86_401, False)],
)
def test_the_fake_kind_bounds_its_boot_s(value: float, accepted: bool) -> None:
    if accepted:
        assert base.parse_config("fake", {"boot_s": value}).model_dump()["boot_s"] == value
    else:
        with pytest.raises(Exception, match=r"config\.boot_s"):
            base.parse_config("fake", {"boot_s": value})


def test_the_simulated_provider_s_boot_s_is_the_first_tick_s_estimate() -> None:
    spec = parse_spec({"name": "q", "elasticity": {"kind": "wait_target", "wait_s": 60, "max": 8}})
    work = [(0.0, 30.0)] * 20
    firsts = []
    for boot_s in (None, 120.0):
        steps: list[plan.Step] = []

        def hear(t: float, kind: str, data: Any, steps: list[plan.Step] = steps) -> None:
            if kind == "tick":
                steps.append(data)

        simulate(
            spec,
            work,
            Fleet(initial=0, boot_s=boot_s),
            duration_s=60,
            rng=random.Random(1),
            trace=hear,
        )
        assert steps[0].decision.estimates is not None
        firsts.append(steps[0].decision.estimates["boot_s"])
    assert [(e["value"], e["source"]) for e in firsts] == [
        (DEFAULT_BOOT_S, "default"),
        (120.0, "provider"),
    ]
