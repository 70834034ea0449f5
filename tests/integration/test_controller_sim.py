"""Hundreds of controller ticks against a simulated fleet, on a fake clock, no sleeping.

Work arrives at random; launched daemons boot (say hello with their launch id) or never
do; workers claim and finish work. Every tick must keep the spec's promises: one decision
per queue, never past ``max`` through the controller's own launches, never below ``min``
through its kills, and never a busy worker killed.
"""

from __future__ import annotations

import random
from typing import Any

import httpx

from tests.conftest import FakeClock
from tests.integration.test_api_workers import hello
from tests.integration.test_controller import NS, W, elastic, provider, queue, submit_many, tick

MIN, MAX = 1, 4


async def test_hundreds_of_ticks_keep_the_bounds_and_spare_busy_workers(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    rng = random.Random(20261202)
    await provider(api)
    await queue(api, "sim", elastic(min=MIN, max=MAX), providerRef="fk")
    held: dict[str, list[str]] = {}  # worker → invocations it holds
    actions: dict[str, int] = {"scale_up": 0, "scale_down": 0, "tick_noop": 0}
    for _ in range(200):
        if rng.random() < 0.25:
            await submit_many(api, "sim", rng.randint(1, 8))
        decision = (await tick(api))["sim"]
        actions[decision["action"]] += 1
        before, after = decision["before"], decision["after"]
        assert before["daemon_count"] == len(held)
        if decision["action"] == "scale_up":
            assert after["daemon_count"] + after["in_flight"] <= MAX
            if rng.random() < 0.8:  # most launches boot; the rest expire after their TTL
                worker = await hello(api, ["sim"], capacity=2, launch_id=decision["launch_id"])
                held[worker] = []
        elif decision["action"] == "scale_down":
            victim = decision["victim"]
            assert held.pop(victim) == [], "a busy worker was killed"
            assert after["daemon_count"] >= MIN
        await _work(api, rng, held)
        clock.advance(5)
    assert actions["scale_up"] > 3 and actions["scale_down"] > 3, actions


async def _work(api: httpx.AsyncClient, rng: random.Random, held: dict[str, list[str]]) -> None:
    """Each worker finishes some of what it holds, then claims what it has room for."""
    for worker, invocations in held.items():
        for invocation in list(invocations):
            if rng.random() < 0.6:
                done = await api.post(
                    f"{W}/{worker}/invocations/{invocation}/complete", json={"result": None}
                )
                assert done.status_code == 200, done.text
                invocations.remove(invocation)
        if rng.random() < 0.7:
            response = await api.post(
                f"{W}/{worker}/claim", json={"timeout_s": 0, "max": 2 - len(invocations)}
            )
            assert response.status_code == 200, response.text
            claimed: list[dict[str, Any]] = response.json()["invocations"]
            invocations.extend(c["id"] for c in claimed)
    stats = (await api.get(f"{NS}/queues/sim/stats")).json()
    assert stats["running"] == sum(len(v) for v in held.values())
