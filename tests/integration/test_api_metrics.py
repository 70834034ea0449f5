"""``GET /metrics``: the exposition parsed as Prometheus would, its values checked against
what the store holds (both stores)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager
from prometheus_client.parser import text_string_to_metric_families

from lakeshore.api.app import create_app
from lakeshore.api.deps import AppState
from lakeshore.config import Settings
from lakeshore.services.taskqueue import reaper
from lakeshore.services.taskqueue import workers as worker_service
from tests.conftest import ADMIN, FakeClock

NS = "/v1/namespaces/default"
W = "/v1/workers"
SUBMIT_ROUTE = "/v1/namespaces/{ns}/queues/{name}/invocations"


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample, keyed by its name and sorted labels."""
    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


def queue_value(found: dict[Any, float], name: str, queue: str, ns: str = "default") -> float:
    return found[(f"lakeshore_queue_{name}", (("namespace", ns), ("queue", queue)))]


async def scrape(api: httpx.AsyncClient) -> dict[Any, float]:
    response = await api.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return samples(response.text)


async def test_queue_gauges_match_the_store(api: httpx.AsyncClient, clock: FakeClock) -> None:
    for i in range(3):
        created = await api.post(f"{NS}/queues/q/invocations", json={"fn": "m:f", "args": [i]})
        assert created.status_code == 201
        clock.advance(10)
    await api.post(f"{NS}/queues", json={"name": "idle"})
    hello = await api.post(
        f"{W}/hello", json={"queues": ["q"], "capabilities": {"max_invocations": 4}}
    )
    worker = hello.json()["id"]
    claimed = await api.post(f"{W}/{worker}/claim", json={"timeout_s": 0, "max": 1})
    assert len(claimed.json()["invocations"]) == 1
    clock.advance(5)

    found = await scrape(api)
    stats = (await api.get(f"{NS}/queues/q/stats")).json()["byState"]
    assert queue_value(found, "pending", "q") == stats["pending"] == 2
    assert queue_value(found, "running", "q") == stats["running"] == 1
    # the oldest pending one is the second submitted: 10 s after the first, 25 s ago
    assert queue_value(found, "oldest_pending_age_seconds", "q") == pytest.approx(25)
    assert queue_value(found, "daemons", "q") == 1
    assert queue_value(found, "capacity", "q") == 4
    assert queue_value(found, "utilization", "q") == pytest.approx(0.25)
    assert queue_value(found, "pending", "idle") == 0
    assert queue_value(found, "oldest_pending_age_seconds", "idle") == 0
    assert found[("lakeshore_store_gauges_exported", ())] == 1


async def test_scrapes_within_a_second_share_one_read_of_the_store(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    await api.post(f"{NS}/queues/q/invocations", json={"fn": "m:f"})
    assert queue_value(await scrape(api), "pending", "q") == 1
    await api.post(f"{NS}/queues/q/invocations", json={"fn": "m:f"})
    clock.advance(0.5)
    assert queue_value(await scrape(api), "pending", "q") == 1
    clock.advance(0.5)
    assert queue_value(await scrape(api), "pending", "q") == 2


async def test_requests_are_counted_by_route_template(api: httpx.AsyncClient) -> None:
    for _ in range(3):
        await api.post(f"{NS}/queues/q/invocations", json={"fn": "m:f"})
    await api.get("/v1/no/such/path")
    found = await scrape(api)
    key = ("method", "POST"), ("route", SUBMIT_ROUTE), ("status", "201")
    assert found[("lakeshore_http_requests_total", key)] == 3
    assert found[("lakeshore_http_request_duration_seconds_count", key[:2])] == 3
    unmatched = ("method", "GET"), ("route", "(unmatched)"), ("status", "404")
    assert found[("lakeshore_http_requests_total", unmatched)] == 1
    assert not any("inv_" in value for _, labels in found for _, value in labels)


async def test_ticks_decisions_and_launches_are_counted(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    for name, config in (("fk", {}), ("broken", {"fail_launch": "quota exceeded"})):
        body = {"name": name, "kind": "fake", "config": config}
        assert (await api.post(f"{NS}/providers", json=body)).status_code == 201
    for name, provider in (("up", "fk"), ("down", "broken")):
        spec = {
            "name": name,
            "providerRef": provider,
            "elasticity": {"kind": "fully_elastic", "min": 0, "max": 1},
        }
        assert (await api.post(f"{NS}/queues", json=spec)).status_code == 201
        await api.post(f"{NS}/queues/{name}/invocations", json={"fn": "m:f"})
    before = await scrape(api)
    ticked = await api.post("/v1/admin/elasticity/tick")
    assert ticked.status_code == 200, ticked.text
    decisions = {d["scope"]: d for d in ticked.json()["decisions"]}
    clock.advance(1)  # the store is read again a second after the last scrape's read
    assert (decisions["up"]["action"], decisions["down"]["action"]) == ("scale_up", "tick_noop")

    after = await scrape(api)
    assert after[("lakeshore_tick_duration_seconds_count", ())] == 1
    total = "lakeshore_decisions_total"
    counted = sum(v for (name, _), v in after.items() if name == total)
    earlier = sum(v for (name, _), v in before.items() if name == total)
    assert counted - earlier == len(decisions)
    up = (("action", "scale_up"), ("rule", decisions["up"]["rule"] or ""))
    assert after[(total, up)] == 1
    calls = "lakeshore_fleet_calls_total"
    ok = (("call", "launch"), ("outcome", "ok"), ("provider", "fk"))
    failed = (("call", "launch"), ("outcome", "failed"), ("provider", "broken"))
    assert (after[(calls, ok)], after[(calls, failed)]) == (1, 1)
    assert queue_value(after, "launches_in_flight", "up") == 1
    assert queue_value(after, "launches_in_flight", "down") == 0  # failed: resolved at once


async def test_metrics_need_the_admin_token(api: httpx.AsyncClient) -> None:
    anonymous = await api.get("/metrics", headers={"Authorization": ""})
    assert anonymous.status_code == 401
    issued = await api.post(f"{NS}/tokens", json={"name": "scraper"})
    namespace_token = {"Authorization": f"Bearer {issued.json()['token']}"}
    refused = await api.get("/metrics", headers=namespace_token)
    assert refused.status_code == 403
    assert "LAKESHORE_METRICS_PUBLIC" in refused.json()["error"]["message"]


@pytest.fixture
async def public_api(settings: Settings, clock: FakeClock) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings.model_copy(update={"metrics_public": True}), clock=clock)
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            yield client


async def test_public_metrics_need_no_token(public_api: httpx.AsyncClient) -> None:
    found = await scrape(public_api)
    assert found[("lakeshore_store_gauges_exported", ())] == 1
    assert (await public_api.get(f"{NS}/queues")).status_code == 401  # nothing else opens


async def test_invocations_are_counted_with_their_wait_and_run_time(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    for i in range(3):
        made = await api.post(f"{NS}/queues/q/invocations", json={"fn": "m:f", "key": f"k{i}"})
        assert made.status_code == 201
    again = await api.post(f"{NS}/queues/q/invocations", json={"fn": "m:f", "key": "k0"})
    assert again.status_code == 200  # its key was taken: nothing new to count
    batch = await api.post(
        f"{NS}/queues/q/invocations/batch", json={"invocations": [{"fn": "m:f"}]}
    )
    assert batch.status_code == 201
    hello = await api.post(
        f"{W}/hello", json={"queues": ["q"], "capabilities": {"max_invocations": 8}}
    )
    worker = hello.json()["id"]
    clock.advance(4)  # each waited 4 s
    claimed = (await api.post(f"{W}/{worker}/claim", json={"timeout_s": 0})).json()
    ids = [c["id"] for c in claimed["invocations"]]
    assert len(ids) == 4
    clock.advance(2)  # each ran 2 s
    error = {"type": "Boom", "message": "no"}
    results = [
        {"id": ids[0], "result": 1},
        {"id": ids[1], "error": error, "retry": True},
        {"id": ids[2], "error": error, "retry": False},
    ]
    reported = await api.post(f"{W}/{worker}/results", json={"results": results})
    assert reported.status_code == 200, reported.text
    done = await api.post(f"{W}/{worker}/invocations/{ids[3]}/complete", json={"result": 2})
    assert done.status_code == 200, done.text

    clock.advance(1)
    found = await scrape(api)
    q = (("namespace", "default"), ("queue", "q"))
    assert found[("lakeshore_invocations_submitted_total", q)] == 4
    outcome = "lakeshore_invocation_outcomes_total"
    for name, count in (("succeeded", 2), ("retried", 1), ("failed", 1)):
        assert found[(outcome, tuple(sorted((*q, ("outcome", name)))))] == count
    assert found[("lakeshore_invocation_wait_seconds_count", q)] == 4
    assert found[("lakeshore_invocation_wait_seconds_sum", q)] == pytest.approx(16)
    assert found[("lakeshore_invocation_run_seconds_count", q)] == 4
    assert found[("lakeshore_invocation_run_seconds_sum", q)] == pytest.approx(8)
    assert found[("lakeshore_invocation_wait_seconds_bucket", (("le", "5.0"), *q))] == 4
    assert found[("lakeshore_invocation_wait_seconds_bucket", (("le", "2.5"), *q))] == 0


@pytest.fixture
async def served(
    settings: Settings, clock: FakeClock
) -> AsyncIterator[tuple[httpx.AsyncClient, AppState]]:
    """The API and its state: the reaper swept by hand with the app's own metrics."""
    app = create_app(settings, clock=clock)
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://t", headers=ADMIN
        ) as client:
            yield client, app.state.lakeshore


async def test_expired_cancelled_and_lost_leases_are_counted(
    served: tuple[httpx.AsyncClient, AppState], clock: FakeClock
) -> None:
    api, state = served
    spec = {"name": "q", "admission": {"deadline_cutoff_s": 10}}
    assert (await api.post(f"{NS}/queues", json=spec)).status_code == 201

    async def submit(n: int = 1, **body: Any) -> list[str]:
        made = [
            await api.post(f"{NS}/queues/q/invocations", json={"fn": "m:f", **body})
            for _ in range(n)
        ]
        assert all(m.status_code == 201 for m in made)
        return [m.json()["id"] for m in made]

    # two expire on a claim's way, one in the reaper's sweep
    await submit(2)
    clock.advance(11)
    hello = await api.post(f"{W}/hello", json={"queues": ["q"]})
    worker = hello.json()["id"]
    claimed = await api.post(f"{W}/{worker}/claim", json={"timeout_s": 0})
    assert claimed.json()["invocations"] == []
    await submit(1)
    clock.advance(11)
    assert (await reaper.reap(state.store, clock(), state.metrics))["expired"] == 1

    # a lease lost twice: retried, then failed for good
    [lost] = await submit(1, max_attempts=2)
    for _ in range(2):
        got = await api.post(f"{W}/{worker}/claim", json={"timeout_s": 0})
        assert [i["id"] for i in got.json()["invocations"]] == [lost]
        clock.advance(worker_service.LEASE_S + 1)
        swept = await reaper.reap(state.store, clock(), state.metrics)
        assert swept["retried"] + swept["failed"] == 1
        clock.advance(60)  # past the retry's backoff, within the worker's time to live
        await api.post(f"{W}/{worker}/heartbeat", json={"running": []})

    # one cancelled alone, three in bulk, one cancelled twice counts once
    one, *_rest = await submit(4)
    for _ in range(2):
        answer = await api.post(f"{NS}/invocations/{one}/cancel")
        assert answer.status_code == 200, answer.text
    bulk = await api.post(f"{NS}/queues/q/invocations/cancel", json={"state": "pending"})
    assert bulk.json() == {"touched": 3}

    found = await scrape(api)
    q = (("namespace", "default"), ("queue", "q"))
    outcomes = {
        name: found.get(
            ("lakeshore_invocation_outcomes_total", tuple(sorted((*q, ("outcome", name)))))
        )
        for name in ("expired", "cancelled", "retried", "failed")
    }
    assert outcomes == {"expired": 3, "cancelled": 4, "retried": 1, "failed": 1}
    assert found[("lakeshore_leases_expired_total", q)] == 2
    stats = (await api.get(f"{NS}/queues/q/stats")).json()["byState"]
    assert (stats["expired"], stats["cancelled"], stats["failed"]) == (3, 4, 1)


async def test_a_lease_handed_back_unbegun_counts_as_taken_back(
    served: tuple[httpx.AsyncClient, AppState], clock: FakeClock
) -> None:
    """A daemon gone silent held one invocation it had begun and one prefetched: both
    leases are taken back (``lakeshore_leases_expired``), the begun one retried, the
    prefetched one returned to the queue uncharged."""
    api, state = served
    body = {"queues": ["p"], "capabilities": {"max_invocations": 1, "prefetch": 1}}
    worker = (await api.post(f"{W}/hello", json=body)).json()["id"]
    for _ in range(2):
        made = await api.post(f"{NS}/queues/p/invocations", json={"fn": "m:f", "max_attempts": 3})
        assert made.status_code == 201, made.text
    claim = {"timeout_s": 0, "max": 2}  # its slot and its prefetch
    held = (await api.post(f"{W}/{worker}/claim", json=claim)).json()["invocations"]
    begun, waiting = [i["id"] for i in held]
    beat = {"running": [begun], "prefetched": [waiting]}
    assert (await api.post(f"{W}/{worker}/heartbeat", json=beat)).status_code == 200
    clock.advance(worker_service.LEASE_S + 1)

    swept = await reaper.reap(state.store, clock(), state.metrics)

    assert (swept["retried"], swept["returned"]) == (1, 1)
    found = await scrape(api)
    assert (
        found[("lakeshore_leases_expired_total", (("namespace", "default"), ("queue", "p")))] == 2
    )
    returned = (await api.get(f"{NS}/invocations/{waiting}")).json()
    assert (returned["state"], returned["attempts"]) == ("pending", 0)


async def test_hysteresis_counters_are_exported(api: httpx.AsyncClient, clock: FakeClock) -> None:
    made = await api.post(f"{NS}/providers", json={"name": "fk", "kind": "fake"})
    assert made.status_code == 201
    spec = {
        "name": "pooled",
        "providerRef": "fk",
        "elasticity": {"kind": "pool_with_threshold", "min": 1, "max": 4},
    }
    assert (await api.post(f"{NS}/queues", json=spec)).status_code == 201, spec
    hello = await api.post(
        f"{W}/hello", json={"queues": ["pooled"], "capabilities": {"max_invocations": 1}}
    )
    worker = hello.json()["id"]
    await api.post(f"{NS}/queues/pooled/invocations", json={"fn": "m:f"})
    claimed = await api.post(f"{W}/{worker}/claim", json={"timeout_s": 0})
    assert len(claimed.json()["invocations"]) == 1  # utilization 1: above any high watermark
    assert (await api.post("/v1/admin/elasticity/tick")).status_code == 200
    clock.advance(1)
    found = await scrape(api)
    counters = (await api.get(f"{NS}/queues/pooled/stats")).json()["counters"]
    assert queue_value(found, "consecutive_above", "pooled") == counters["consecutiveAbove"] == 1
    assert queue_value(found, "consecutive_below", "pooled") == counters["consecutiveBelow"] == 0
