"""The simulator and the real controller take the same decisions on the same inputs.

The simulator plays a workload and tells every event of its model (arrivals, boots,
dispatches, finishes, ticks). The same events are then made to happen, at the same
virtual seconds, to a real server through its HTTP API: submits, daemons saying hello
with the launch id the controller gave, claims, completions, and ticks of the real
controller (fake provider, fake clock). Tick by tick, the server's decision must be the
simulator's: the same action, reason, rule and signals — for ``wait_target`` too, whose
estimates the server learns from its tables and the simulator from its model, and for
steps of several launches or kills (``max_step``).
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any

import httpx
import pytest

from lakeshore.domain.queue import parse_spec
from lakeshore.elasticity.plan import Step
from lakeshore.elasticity.simulate import Fleet, simulate
from lakeshore.elasticity.workload import Arrivals, Dist, synthetic
from tests.conftest import FakeClock
from tests.integration.test_api_workers import claim, hello
from tests.integration.test_controller import NS, W, provider, tick

SLOTS = 2
POLICIES = [
    {"kind": "fully_elastic", "min": 0, "max": 4},
    {"kind": "pool_with_threshold", "min": 1, "max": 4, "scaleUpThreshold": 0.6},
    {"kind": "max_count", "max": 3},
    {"kind": "fully_elastic", "min": 0, "max": 6, "max_step": 3},
    {"kind": "wait_target", "wait_s": 20, "max": 6},
]
IDS = [p["kind"] + ("-max_step" if "max_step" in p else "") for p in POLICIES]


def _trace(elasticity: dict[str, Any]) -> tuple[list[tuple[float, str, Any]], int]:
    """The simulator's events for a 15-minute day: quiet, a rush, quiet again."""
    spec = parse_spec({"name": "twin", "elasticity": elasticity, "providerRef": "fk"})
    rng = random.Random(20261204)
    arrivals = Arrivals.parse("steps:0.03,3m=0.35,8m=0.02")
    work = synthetic(arrivals, Dist.parse("uniform:2,18"), 900, rng)
    events: list[tuple[float, str, Any]] = []
    fleet = Fleet(boot=Dist.parse("fixed:12"), capacity=SLOTS, interval_s=5.0)
    report = simulate(
        spec,
        work,
        fleet,
        duration_s=900,
        rng=random.Random(1),
        trace=lambda t, kind, data: events.append((t, kind, data)),
    )
    return events, report.launches


@pytest.mark.parametrize("elasticity", POLICIES, ids=IDS)
async def test_the_simulator_and_the_controller_decide_alike_tick_by_tick(
    api: httpx.AsyncClient, clock: FakeClock, elasticity: dict[str, Any]
) -> None:
    events, launches = _trace(elasticity)
    assert launches > 1  # the rush moves the fleet, so the comparison is not all no-ops
    await provider(api)
    body = {"name": "twin", "elasticity": elasticity, "providerRef": "fk"}
    assert (await api.post(f"{NS}/queues", json=body)).status_code == 201
    twin = _Twin(api)
    now = 0.0
    for t, kind, data in events:
        clock.advance(t - now)
        now = t
        await twin.play(kind, data)
    assert twin.ticks == 180, twin.ticks
    # every launch, and the kills after the rush (wait_target keeps its steady need)
    kept = 0 if elasticity["kind"] != "wait_target" else launches // 2
    assert twin.moves >= 2 * launches - 1 - kept, (twin.moves, launches)


class _Twin:
    """The real server, made to follow the simulator's events."""

    def __init__(self, api: httpx.AsyncClient) -> None:
        self.api = api
        self.real: dict[str, str] = {}  # the simulator's daemon → the server's worker
        self.held: dict[str, list[str]] = {}  # the server's worker → what it runs
        self.launches: deque[str] = deque()  # launch ids, in the order they boot
        self.ticks = self.moves = 0

    async def play(self, kind: str, data: Any) -> None:
        if kind == "arrive":
            items = {"invocations": [{"fn": "tests.udfs:noop"}]}
            sent = await self.api.post(f"{NS}/queues/twin/invocations/batch", json=items)
            assert sent.status_code == 201, sent.text
        elif kind == "boot":
            # the daemons of the start (a policy's min) before the first tick; then each
            # boot is a launch's, in launch order (the boot delay is fixed)
            launch = {"launch_id": self.launches.popleft()} if self.ticks else {}
            worker = await hello(self.api, ["twin"], capacity=SLOTS, **launch)
            self.real[data], self.held[worker] = worker, []
        elif kind == "dispatch":
            worker = self.real[data]
            [claimed] = await claim(self.api, worker, max=1)
            self.held[worker].append(claimed["id"])
        elif kind == "finish":
            worker = self.real[data]
            done = await self.api.post(
                f"{W}/{worker}/invocations/{self.held[worker].pop(0)}/complete",
                json={"result": None},
            )
            assert done.status_code == 200, done.text
        else:
            await self.tick(data)

    async def tick(self, step: Step) -> None:
        for worker in self.held:  # every daemon of the model is heard from at each tick
            beat = await self.api.post(f"{W}/{worker}/heartbeat")
            assert beat.status_code == 200, beat.text
        decision = (await tick(self.api))["twin"]
        self.ticks += 1
        seen = (decision["action"], decision["reason"], decision["rule"], decision["before"])
        wanted = (step.action, step.decision.reason, step.decision.rule, step.before())
        assert seen == wanted, f"tick {self.ticks}"
        if step.launch is not None:
            self.launches.extend(decision.get("launch_ids") or [decision["launch_id"]])
            self.moves += step.launch.count
        elif step.victims:
            killed = decision.get("victims") or [decision["victim"]]
            for modelled, real in zip(step.victims, killed, strict=True):
                self._kill(modelled, real)
            self.moves += len(step.victims)

    def _kill(self, modelled: str, killed: str) -> None:
        """Both killed an idle daemon; when not the same one, the two idle daemons swap
        partners so that the model's later events land where they should."""
        partner = self.real.pop(modelled)
        assert self.held.pop(killed) == [], "a busy worker was killed"
        if partner != killed:
            assert self.held[partner] == []
            [other] = [sim for sim, real in self.real.items() if real == killed]
            self.real[other] = partner
