"""Retry policies through the API (both stores): a queue's policy, a submit's over it,
fixed at submit and shown on the invocation; never/only by exception type; full-jitter
waits below their bound; a lease lost to a crash retried whatever the lists say."""

from __future__ import annotations

from typing import Any

import httpx

from lakeshore.services.taskqueue import reaper
from lakeshore.services.taskqueue import workers as worker_service
from lakeshore.store.engine import Store
from tests.conftest import FakeClock
from tests.integration.test_api_workers import NS, W, claim, hello, submit


async def make_queue(api: httpx.AsyncClient, name: str, retry: dict[str, Any]) -> None:
    made = await api.post(f"{NS}/queues", json={"name": name, "retry": retry})
    assert made.status_code == 201, made.text
    assert made.json()["retry"] == retry  # the queue's policy, as written


async def fail(api: httpx.AsyncClient, worker: str, invocation_id: str, kind: str) -> str:
    """Fail the held invocation with an error of type ``kind``: its new state."""
    body = {"results": [{"id": invocation_id, "error": {"type": kind, "message": "m"}}]}
    answer = await api.post(f"{W}/{worker}/results", json=body)
    assert answer.status_code == 200, answer.text
    return str((await api.get(f"{NS}/invocations/{invocation_id}")).json()["state"])


async def test_never_fails_at_once_and_only_retries_just_those(api: httpx.AsyncClient) -> None:
    await make_queue(api, "never", {"never": ["ValueError"], "base_s": 0.0})
    await make_queue(api, "only", {"only": ["IOError"], "base_s": 0.0})
    worker = await hello(api, ["never", "only"])
    for queue, kind, state in [
        ("never", "ValueError", "failed"),
        ("never", "KeyError", "pending"),
        ("only", "IOError", "pending"),
        ("only", "ValueError", "failed"),
    ]:
        made = await submit(api, queue)
        [held] = await claim(api, worker)
        assert held["id"] == made["id"]
        assert await fail(api, worker, held["id"], kind) == state, (queue, kind)
        if state == "pending":  # out of the way of the next case
            await api.post(f"{NS}/invocations/{held['id']}/cancel")


async def test_a_submit_s_policy_is_its_own_over_its_queue_s_and_fixed_at_submit(
    api: httpx.AsyncClient,
) -> None:
    await make_queue(api, "layers", {"max_attempts": 5, "backoff": "fixed", "base_s": 2.0})
    plain = await submit(api, "layers")
    own = await submit(api, "layers", retry={"max_attempts": 2, "never": ["KeyError"]})
    shorthand = await submit(api, "layers", max_attempts=7, retry={"max_attempts": 9})
    policy = {"backoff": "fixed", "base_s": 2.0, "max_s": 60.0, "jitter": True, "only": []}
    assert plain["retry"] == {**policy, "max_attempts": 5, "never": []}
    assert own["retry"] == {**policy, "max_attempts": 2, "never": ["KeyError"]}
    assert (shorthand["retry"]["max_attempts"], shorthand["max_attempts"]) == (7, 7)
    # a change of the queue's policy does not change what was promised at submit
    patched = await api.patch(f"{NS}/queues/layers", json={"retry": {"max_attempts": 1}})
    assert patched.status_code == 200, patched.text
    again = (await api.get(f"{NS}/invocations/{plain['id']}")).json()
    assert again["retry"] == plain["retry"]
    later = await submit(api, "layers")
    assert later["retry"]["max_attempts"] == 1
    default = await submit(api, "elsewhere")  # no policy anywhere: the default, shown
    assert default["retry"] == {
        "max_attempts": 3,
        "backoff": "exponential",
        "base_s": 1.0,
        "max_s": 60.0,
        "jitter": True,
        "never": [],
        "only": [],
    }


async def test_waits_are_drawn_below_their_bound(api: httpx.AsyncClient, clock: FakeClock) -> None:
    await make_queue(api, "jitter", {"base_s": 8.0, "max_s": 8.0})
    worker = await hello(api, ["jitter"], capacity=20)
    for _ in range(20):
        await submit(api, "jitter")
    held = await claim(api, worker, max=20)
    assert len(held) == 20
    body = {"results": [{"id": h["id"], "error": {"type": "E", "message": "m"}} for h in held]}
    assert (await api.post(f"{W}/{worker}/results", json=body)).status_code == 200
    # a second at a time: each comes back within its bound of 8 s, not all at once
    back_at: list[int] = []
    for second in range(9):
        back_at += [second] * len(await claim(api, worker, max=20))
        clock.advance(1)
    assert len(back_at) == 20, back_at
    assert len(set(back_at)) > 1, back_at  # drawn, not one fixed wait


async def test_a_lease_lost_to_a_crash_is_retried_whatever_only_says(
    api: httpx.AsyncClient, store: Store, clock: FakeClock
) -> None:
    await make_queue(api, "crashy", {"only": ["IOError"], "max_attempts": 2})
    made = await submit(api, "crashy")
    worker = await hello(api, ["crashy"])
    await claim(api, worker)
    clock.advance(worker_service.LEASE_S + 1)
    assert (await reaper.reap(store, clock()))["retried"] == 1
    clock.advance(60)  # past its wait
    [again] = await claim(api, worker)
    assert (again["id"], again["attempts"]) == (made["id"], 2)
    clock.advance(worker_service.LEASE_S + 1)
    assert (await reaper.reap(store, clock()))["failed"] == 1  # its attempts are spent


async def test_a_bad_policy_is_refused_naming_its_field(api: httpx.AsyncClient) -> None:
    for body, field in [
        ({"name": "bad1", "retry": {"backoff": "linear"}}, "retry.backoff"),
        ({"name": "bad2", "retry": {"base_s": 10, "max_s": 1}}, "retry"),
        ({"name": "bad3", "retry": {"never": "ValueError"}}, "retry.never"),
    ]:
        refused = await api.post(f"{NS}/queues", json=body)
        assert refused.status_code == 422, refused.text
        assert field in refused.text, refused.text
    bad = await api.post(f"{NS}/queues/q/invocations", json={"fn": "m:f", "retry": {"jitter": 1}})
    assert bad.status_code == 422, bad.text
    assert "retry.jitter" in bad.text
