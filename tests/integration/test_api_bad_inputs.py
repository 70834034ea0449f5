"""Inputs that once answered 500 (or a 200 with a truncated stream), one case each.

Each case is a request that a hostile or broken client sent and the server could not
handle (issue 10's list, and what the edge fuzzing found next to it): a NUL (``%00``) in
an id in the path (PostgreSQL keeps NUL in no text), in a query value, in a header or in
an id inside a body; an integer past what the store's column holds (2**31 for an
``INTEGER``, 2**63 for a ``BIGINT`` or SQLite's 64-bit integer); a number past a 64-bit
float (a priority of 10**400); a timestamp whose UTC time is past year 9999; a stream
position past the item numbers; a deadline the date arithmetic cannot hold; a rate so
near 0 that its Retry-After is infinite. Every case runs on SQLite and PostgreSQL.

Each must now be the 4xx its place gives (see "Bounds" in docs/api.md), in the error
envelope (``fuzzing.assert_refusal``) and naming its field where it names one, and lose
nothing: the world seeded before it (a worker holding a running invocation, a pending and
a finished one, a queue in a pool with its events) reads back the same after it. The
cases share one served app per store (``fuzzing.serve_fresh``), as none may change it.

The last tests hold the bounds themselves in range (the largest value is taken), and a
queue stored before its bounds readable (read at them).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from sqlalchemy import update

from lakeshore.domain.queue import MAX_DURATION_S
from lakeshore.store.engine import Store
from lakeshore.store.tables import queues
from tests.conftest import (
    ADMIN,
    BACKENDS,
)
from tests.integration.fuzzing import NO_BODY, Served, assert_refusal, send, serve_fresh

NS = "/v1/namespaces/default"
W = "/v1/workers"
WORKER = "w-held"
HUGE_PRIORITY = 10**400


@dataclass
class World:
    """The app on one store, seeded: a worker holding a running invocation, a pending one
    and a finished one, a priority queue in a pool with a scale event. Every case is
    refused, so the cases share it (a case that changed it fails its own snapshot check)."""

    served: Served
    worker: str
    finished: str  # succeeded: its stream ends at once (a running one's never would)
    running: str  # held by ``worker``
    pending: str

    def snapshot(self) -> list[Any]:
        reads = [
            f"{NS}/invocations/{self.finished}",
            f"{NS}/invocations/{self.running}",
            f"{NS}/invocations/{self.pending}",
            f"{NS}/queues/pq/invocations",
            f"{NS}/queues/pq",
            f"{NS}/queues/pq/events?verbose=true",
            f"{NS}/daemons",
        ]
        answers = []
        for url in reads:
            response = self.served.request("GET", url, headers=ADMIN)
            assert response.status_code == 200, f"{url}: {response.text}"
            answers.append(response.json())
        return answers


def _seed(served: Served) -> World:
    queue = {
        "name": "pq",
        "kind": "priority",
        "elasticity": {"kind": "pool_with_threshold", "pool": "pool1", "max": 2},
    }
    served.ok("POST", f"{NS}/queues", json=queue)
    hello = {"id": WORKER, "queues": ["pq"], "capabilities": {"max_invocations": 1}}
    served.ok("POST", f"{W}/hello", json=hello)
    held = []
    for fn in ("m:done", "m:running"):
        submitted = served.ok("POST", f"{NS}/queues/pq/invocations", json={"fn": fn}).json()
        claimed = served.ok("POST", f"{W}/{WORKER}/claim", json={"timeout_s": 0}).json()
        assert [i["id"] for i in claimed["invocations"]] == [submitted["id"]]
        held.append(submitted["id"])
        if fn == "m:done":
            served.ok(
                "POST", f"{W}/{WORKER}/invocations/{submitted['id']}/complete", json={"result": 1}
            )
    pending = served.ok("POST", f"{NS}/queues/pq/invocations", json={"fn": "m:g"}).json()
    served.ok("POST", "/v1/admin/elasticity/tick")  # an event to page through
    return World(served, worker=WORKER, finished=held[0], running=held[1], pending=pending["id"])


@pytest.fixture(scope="module", params=BACKENDS)
def world(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    """One served, seeded app per store for the whole module (a fresh database of its own)."""
    with serve_fresh(request, tmp_path_factory) as served:
        yield _seed(served)


@dataclass(frozen=True)
class Bad:
    """One bad request: where, what, and the status it must get."""

    method: str
    url: str  # ``{worker}``, ``{finished}``, ``{running}``, ``{pending}``: from the world
    status: int
    body: Any = NO_BODY
    params: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    raw: bytes | None = None  # a body sent as these bytes
    field: str | None = None  # the field the refusal names, when it names one


CASES: dict[str, Bad] = {
    # a NUL in an id in the path
    "get-invocation-nul": Bad("GET", f"{NS}/invocations/%00", 404),
    "cancel-invocation-nul": Bad("POST", f"{NS}/invocations/%00/cancel", 404),
    "stream-invocation-nul": Bad("GET", f"{NS}/invocations/%00/stream", 404),
    "claim-worker-nul": Bad("POST", f"{W}/%00/claim", 404, body={"timeout_s": 0}),
    "heartbeat-worker-nul": Bad("POST", f"{W}/%00/heartbeat", 404, body={}),
    "bye-worker-nul": Bad("POST", f"{W}/%00/bye", 404),
    "results-worker-nul": Bad("POST", f"{W}/%00/results", 404, body={"results": []}),
    "complete-invocation-nul": Bad(
        "POST", W + "/{worker}/invocations/%00/complete", 404, body={"result": 1}
    ),
    "fail-invocation-nul": Bad(
        "POST", W + "/{worker}/invocations/%00/fail", 404, body={"error": {"message": "x"}}
    ),
    "append-stream-invocation-nul": Bad(
        "POST", W + "/{worker}/invocations/%00/stream", 404, body={"seq": 0, "items": [1]}
    ),
    "delete-daemon-nul": Bad("DELETE", f"{NS}/daemons/%00", 404),
    "queue-name-nul": Bad("GET", f"{NS}/queues/%00", 404),
    "namespace-nul": Bad("GET", "/v1/namespaces/%00/queues", 404),
    "provider-name-nul": Bad("GET", f"{NS}/providers/%00", 404),
    "pool-name-nul": Bad("GET", f"{NS}/pools/%00/events", 404),
    # the same bytes, not text, in the path: not UTF-8, and a lone surrogate's encoding
    "invocation-not-utf8": Bad("GET", f"{NS}/invocations/%FF", 404),
    "invocation-lone-surrogate": Bad("GET", f"{NS}/invocations/%ED%A0%80", 404),
    # a NUL in a query value, and in a header the API reads
    "daemons-queue-nul": Bad("GET", f"{NS}/daemons", 422, params={"queue": "\x00"}, field="queue"),
    "invocations-cursor-nul": Bad(
        "GET", f"{NS}/queues/pq/invocations", 422, params={"cursor": "x\x00|y"}, field="cursor"
    ),
    "query-not-utf8": Bad("GET", f"{NS}/daemons?queue=%FF", 422, field="queue"),
    "authorization-nul": Bad(
        "GET", f"{NS}/queues", 401, headers={"authorization": "Bearer lks_" + "0" * 31 + "\x00_s"}
    ),
    "last-event-id-nul": Bad(
        "GET",
        NS + "/invocations/{finished}/stream",
        422,
        headers={"last-event-id": "1\x00"},
        field="last-event-id",
    ),
    # a NUL in an id in a body
    "results-id-nul": Bad(
        "POST",
        W + "/{worker}/results",
        422,
        body={"results": [{"id": "\x00"}]},
        field="results[0].id",
    ),
    "heartbeat-running-nul": Bad(
        "POST", W + "/{worker}/heartbeat", 422, body={"running": ["\x00"]}, field="running[0]"
    ),
    "heartbeat-running-surrogate": Bad(
        "POST", W + "/{worker}/heartbeat", 422, raw=b'{"running": ["\\ud800"]}', field="running[0]"
    ),
    "hello-launch-id-nul": Bad(
        "POST",
        f"{W}/hello",
        422,
        body={"id": "w-new", "queues": ["pq"], "launch_id": "\x00"},
        field="launch_id",
    ),
    "hello-tag-nul": Bad(
        "POST",
        f"{W}/hello",
        422,
        body={"id": "w-new", "queues": ["pq"], "tags": ["a\x00"]},
        field="tags[0]",
    ),
    "hello-capabilities-extra-nul": Bad(
        "POST",
        f"{W}/hello",
        422,
        body={"id": "w-new", "queues": ["pq"], "capabilities": {"gpu": "a\x00"}},
        field="capabilities.gpu",
    ),
    # event ids past a BIGINT
    "queue-events-since-2**63": Bad(
        "GET", f"{NS}/queues/pq/events", 422, params={"since": str(2**63)}, field="since"
    ),
    "queue-events-cursor-2**63": Bad(
        "GET", f"{NS}/queues/pq/events", 422, params={"cursor": str(2**63)}, field="cursor"
    ),
    "pool-events-since-2**63": Bad(
        "GET", f"{NS}/pools/pool1/events", 422, params={"since": str(2**63)}, field="since"
    ),
    "pool-events-cursor-2**63": Bad(
        "GET", f"{NS}/pools/pool1/events", 422, params={"cursor": str(2**63)}, field="cursor"
    ),
    # a worker's count past an INTEGER (PostgreSQL) and a 64-bit integer (SQLite)
    "hello-current-invocations-2**31": Bad(
        "POST",
        f"{W}/hello",
        422,
        body={"id": WORKER, "queues": ["pq"], "capabilities": {"current_invocations": 2**31}},
        field="capabilities.current_invocations",
    ),
    "hello-current-invocations-2**63": Bad(
        "POST",
        f"{W}/hello",
        422,
        body={"id": WORKER, "queues": ["pq"], "capabilities": {"current_invocations": 2**63}},
        field="capabilities.current_invocations",
    ),
    # a priority past a 64-bit float, on a priority queue
    "submit-priority-10**400": Bad(
        "POST",
        f"{NS}/queues/pq/invocations",
        422,
        body={"fn": "m:f", "kwargs": {"priority": HUGE_PRIORITY}},
        field="kwargs.priority",
    ),
    "batch-priority-10**400": Bad(
        "POST",
        f"{NS}/queues/pq/invocations/batch",
        422,
        body={
            "invocations": [{"fn": "m:f"}, {"fn": "m:f", "kwargs": {"priority": -HUGE_PRIORITY}}]
        },
        field="invocations[1].kwargs.priority",
    ),
    # a cursor whose time in UTC is past year 9999
    "invocations-cursor-past-9999": Bad(
        "GET",
        f"{NS}/queues/pq/invocations",
        422,
        params={"cursor": "9999-12-31T23:59:59-23:59|x"},
        field="cursor",
    ),
    # stream positions past the item numbers
    "stream-after-2**63-1": Bad(
        "GET",
        NS + "/invocations/{finished}/stream",
        422,
        params={"after": str(2**63 - 1)},
        field="after",
    ),
    "stream-last-event-id-10**19": Bad(
        "GET",
        NS + "/invocations/{finished}/stream",
        422,
        headers={"last-event-id": str(10**19)},
        field="last-event-id",
    ),
    # a deadline the date arithmetic cannot hold
    "create-deadline-cutoff-1e11": Bad(
        "POST",
        f"{NS}/queues",
        422,
        body={"name": "late", "admission": {"deadline_cutoff_s": 1e11}},
        field="admission.deadline_cutoff_s",
    ),
    # a rate whose Retry-After is infinite
    "create-rate-limit-5e-324": Bad(
        "POST",
        f"{NS}/queues",
        422,
        body={"name": "slow", "admission": {"rate_limit": 5e-324}},
        field="admission.rate_limit",
    ),
    "patch-deadline-cutoff-1e11": Bad(
        "PATCH",
        f"{NS}/queues/pq",
        422,
        body={"admission": {"deadline_cutoff_s": 1e11}},
        field="admission.deadline_cutoff_s",
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_bad_input_is_refused_and_changes_nothing(world: World, case: Bad) -> None:
    before = world.snapshot()
    url = case.url.format(
        worker=world.worker, finished=world.finished, running=world.running, pending=world.pending
    )
    headers = httpx.Headers(ADMIN)  # a case's header replaces the admin's, whatever its case
    headers.update(case.headers)
    content = case.raw
    if case.body is not NO_BODY:
        content = json.dumps(case.body).encode()
    if content is not None:
        headers["content-type"] = "application/json"
    response = world.served.request(
        case.method, url, content=content, headers=headers, params=case.params or None
    )
    assert response.status_code < 500, f"{case.method} {url} answered {response.status_code}"
    error = assert_refusal(response, case.status)
    if case.field is not None:
        assert error.get("field") == case.field, error
    assert world.snapshot() == before, "a refused request changed what was stored"


# --------------------------------------------------------------------------------------
# The bounds are where the docs say: the largest value in range is taken
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Edge:
    method: str
    url: str  # ``{finished}``: an invocation that succeeded
    status: int
    body: Any = NO_BODY
    params: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)


EDGES: dict[str, Edge] = {
    "deadline-cutoff-10-years": Edge(
        "POST",
        f"{NS}/queues",
        201,
        body={"name": "slow", "admission": {"deadline_cutoff_s": MAX_DURATION_S}},
    ),
    "priority-float-max": Edge(
        "POST",
        f"{NS}/queues/pq/invocations",
        201,
        body={"fn": "m:f", "kwargs": {"priority": -1.7976931348623157e308}},
    ),
    "priority-10**400-on-a-fifo-queue": Edge(
        "POST",
        f"{NS}/queues/fq/invocations",
        201,
        body={"fn": "m:f", "kwargs": {"priority": HUGE_PRIORITY}},
    ),
    "events-since-2**63-1": Edge(
        "GET", f"{NS}/queues/pq/events", 200, params={"since": str(2**63 - 1)}
    ),
    "events-cursor-2**63-1": Edge(
        "GET", f"{NS}/queues/pq/events", 200, params={"cursor": str(2**63 - 1)}
    ),
    "invocations-cursor-year-9999-in-utc": Edge(
        "GET",
        f"{NS}/queues/pq/invocations",
        200,
        params={"cursor": "9999-12-31T23:59:59+00:00|x"},
    ),
    "stream-after-2**31-1": Edge(
        "GET", NS + "/invocations/{finished}/stream", 200, params={"after": str(2**31 - 1)}
    ),
    "stream-last-event-id-2**31-1": Edge(
        "GET", NS + "/invocations/{finished}/stream", 200, headers={"last-event-id": str(2**31 - 1)}
    ),
    "hello-current-invocations-2**31-1": Edge(
        "POST",
        f"{W}/hello",
        200,
        body={"queues": ["fq"], "capabilities": {"current_invocations": 2**31 - 1}},
    ),
}


@pytest.mark.parametrize("edge", EDGES.values(), ids=EDGES.keys())
async def test_the_bound_itself_is_in_range(api: httpx.AsyncClient, edge: Edge) -> None:
    for queue in ({"name": "pq", "kind": "priority"}, {"name": "fq"}):
        assert (await api.post(f"{NS}/queues", json=queue)).status_code == 201
    await api.post(f"{W}/hello", json={"id": "w-1", "queues": ["fq"]})
    done = await api.post(f"{NS}/queues/fq/invocations", json={"fn": "m:f"})
    await api.post(f"{W}/w-1/claim", json={"timeout_s": 0})
    await api.post(f"{W}/w-1/invocations/{done.json()['id']}/complete", json={"result": 1})
    url = edge.url.format(finished=done.json()["id"])
    response = await send(
        api, edge.method, url, body=edge.body, headers=edge.headers or None, params=edge.params
    )
    assert response.status_code == edge.status, response.text
    if isinstance(edge.body, dict) and "kwargs" in edge.body:  # user data reads back whole
        got = await send(api, "GET", f"{NS}/invocations/{response.json()['id']}")
        assert got.json()["kwargs"] == edge.body["kwargs"]


async def test_a_queue_stored_before_its_bounds_reads_at_them(
    api: httpx.AsyncClient, store: Store
) -> None:
    assert (await api.post(f"{NS}/queues", json={"name": "old"})).status_code == 201
    stored = {"deadline_cutoff_s": 1e9, "max_depth": 2**40, "rate_limit": 1e-9}
    async with store.write() as conn:  # as a server without the bounds let it be written
        await conn.execute(update(queues).where(queues.c.name == "old").values(admission=stored))
    read = await send(api, "GET", f"{NS}/queues/old")
    assert read.status_code == 200, read.text
    assert read.json()["admission"] == {
        "deadline_cutoff_s": MAX_DURATION_S,
        "max_depth": 2**31 - 1,
        "rate_limit": 1e-6,
    }
    listed = await send(api, "GET", f"{NS}/queues")
    assert [q["admission"] for q in listed.json()["queues"]] == [read.json()["admission"]]
