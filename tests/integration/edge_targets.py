"""What the edge fuzz tests aim at and how they ask: the operations, the seeded records,
a valid request for each operation, and the checks every answer must pass.

``operations`` lists every operation of the published schema with its path, query and
header parameters and their schema types. ``World`` is one served app with records worth
aiming at — the namespace, a priority queue in a pool of its own, launching through the
``fk`` fake provider, a launched daemon's worker (registered with its worker token) holding a
running invocation, a pending and a finished one, and a scale event — made anew
(``restore``) when a request that succeeded has changed them. ``plain``
is a request of an operation that the server takes, for the admin: a test then puts one
edge value (``tests/integration/edges.py``) in one place of it, or draws many.

``check`` is what every answer must pass: never a 5xx; a 4xx in the error envelope; a
stream answered 200 ends with its ``end`` event; nothing but the probes (``/healthz``,
``/readyz``) succeeds without a token that opens something; a worker token only on the
worker routes; a namespace token never on an admin route.

Not a test module; ``conftest.py`` has pytest rewrite its asserts.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from lakeshore.services.auth import WORKER_ROUTES  # a worker token's routes
from tests.conftest import ADMIN
from tests.integration import edges
from tests.integration.fuzzing import Served, assert_refusal

NS = "/v1/namespaces/default"
PROBES = frozenset({"/healthz", "/readyz"})  # answer anyone
ADMIN_ONLY = frozenset(
    {"POST /v1/namespaces", "POST /v1/namespaces/{ns}/tokens", "POST /v1/admin/elasticity/tick"}
)
NO_BODY: Any = object()


# --------------------------------------------------------------------------------------
# The operations, from the published schema
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Param:
    name: str
    where: str  # path, query or header
    kind: str  # the schema type: string, integer, number, boolean, array


@dataclass(frozen=True)
class Operation:
    method: str
    path: str
    params: tuple[Param, ...]
    takes_body: bool

    @property
    def label(self) -> str:
        return f"{self.method} {self.path}"

    def of(self, where: str) -> list[Param]:
        return [p for p in self.params if p.where == where]

    @property
    def follows_a_stream(self) -> bool:
        return self.method == "GET" and self.path.endswith("/stream")


def _kind(schema: dict[str, Any]) -> str:
    for option in schema.get("anyOf", [schema]):
        if option.get("type") not in (None, "null"):
            return str(option["type"])
    return "string"


def operations(schema: dict[str, Any]) -> list[Operation]:
    found = []
    for path, methods in schema["paths"].items():
        for method, spec in methods.items():
            params = tuple(
                Param(p["name"], p["in"], _kind(p.get("schema", {})))
                for p in spec.get("parameters", [])
            )
            takes_body = "requestBody" in spec or method in ("post", "patch")
            found.append(Operation(method.upper(), path, params, takes_body))
    return found


# --------------------------------------------------------------------------------------
# The seeded records
# --------------------------------------------------------------------------------------


@dataclass
class World:
    """One served app and the records its requests aim at (new ids each generation)."""

    served: Served
    tokens: dict[str, str]  # launch id -> the worker token the launch minted
    namespace_token: str = ""
    generation: int = 0
    queue: str = ""
    pool: str = ""
    worker: str = ""
    worker_token: str = ""
    launch_id: str = ""
    finished: str = ""
    running: str = ""
    pending: str = ""
    names: Iterator[int] = field(default_factory=itertools.count)

    @classmethod
    def seed(cls, served: Served, tokens: dict[str, str]) -> World:
        served.ok("POST", f"{NS}/providers", json={"name": "fk", "kind": "fake", "config": {}})
        token = served.ok("POST", f"{NS}/tokens", json={"name": "edges"}).json()["token"]
        world = cls(served=served, tokens=tokens, namespace_token=str(token))
        world.regenerate()
        served.ok("POST", "/v1/admin/elasticity/tick")  # scale events to page through
        return world

    def regenerate(self) -> None:
        """A new queue and a daemon launched for it, whose worker holds a running
        invocation; a pending and a finished invocation."""
        ok = self.served.ok
        self.generation += 1
        self.queue, self.pool = f"g{self.generation}", f"pool-{self.generation}"
        spec = {
            "name": self.queue,
            "kind": "priority",
            "providerRef": "fk",
            "elasticity": {"kind": "pool_with_threshold", "pool": self.pool, "max": 2},
        }
        ok("POST", f"{NS}/queues", json=spec)
        launched = ok("POST", f"{NS}/daemons", json={"queue": self.queue}).json()
        self.launch_id = launched["launches"][0]["launchId"]
        self.worker_token = self.tokens[self.launch_id]
        hello = {"queues": [self.queue], "launch_id": self.launch_id}
        joined = self.served.request(
            "POST",
            "/v1/workers/hello",
            json={**hello, "capabilities": {"max_invocations": 1}},
            headers={"Authorization": f"Bearer {self.worker_token}"},
        )
        assert joined.status_code == 200, joined.text
        self.worker = joined.json()["id"]
        self.finished = self._run_one()
        done = f"/v1/workers/{self.worker}/invocations/{self.finished}/complete"
        ok("POST", done, json={"result": 1})
        self.running = self._run_one()
        self.pending = self._submit()

    def _submit(self) -> str:
        submitted = self.served.ok(
            "POST", f"{NS}/queues/{self.queue}/invocations", json={"fn": "m:f"}
        )
        return str(submitted.json()["id"])

    def _run_one(self) -> str:
        """The id of what the worker claims next (submitted first if nothing is pending)."""
        claim = f"/v1/workers/{self.worker}/claim"
        got = self.served.ok("POST", claim, json={"timeout_s": 0}).json()["invocations"]
        if not got:
            self._submit()
            got = self.served.ok("POST", claim, json={"timeout_s": 0}).json()["invocations"]
        assert len(got) == 1, got
        return str(got[0]["id"])

    def restore(self) -> None:
        """Make the records as seeded again after a request that may have changed them:
        a new running or pending invocation when one has moved on, all anew when the
        worker or the queue has."""

        def read(url: str) -> Any:
            response = self.served.request("GET", url, headers=ADMIN)
            return response.json() if response.status_code == 200 else None

        daemons = read(f"{NS}/daemons?queue={self.queue}") or {"daemons": []}
        queue = read(f"{NS}/queues/{self.queue}") or {}
        if queue.get("state") != "active" or not any(
            d["id"] == self.worker and d["capacity"] == 1 for d in daemons["daemons"]
        ):
            self.regenerate()
            return
        running = read(f"{NS}/invocations/{self.running}") or {}
        if (running.get("state"), running.get("worker")) != ("running", self.worker):
            self.running = self._run_one()  # takes the pending one, if it still is
        pending = read(f"{NS}/invocations/{self.pending}") or {}
        if pending.get("state") != "pending":
            self.pending = self._submit()

    def ids(self, operation: Operation, param: str) -> list[str]:
        """The seeded values worth aiming ``param`` of ``operation`` at."""
        if param == "name":
            return ["fk"] if "/providers/" in operation.path else [self.queue]
        if param == "invocation_id" and operation.follows_a_stream:
            return [self.finished]  # a running invocation's stream would not end
        return {
            "ns": ["default"],
            "pool": [self.pool],
            "worker_id": [self.worker],
            "invocation_id": [self.running, self.pending, self.finished],
        }.get(param, [])

    def token(self, caller: str) -> str | None:
        return {
            "admin": ADMIN["Authorization"].removeprefix("Bearer "),
            "namespace": self.namespace_token,
            "worker": self.worker_token,
        }.get(caller)

    def fresh(self, prefix: str) -> str:
        return f"{prefix}{next(self.names)}"


# --------------------------------------------------------------------------------------
# Requests
# --------------------------------------------------------------------------------------


def template(operation: Operation, world: World) -> Any:
    """A body the operation takes for the seeded records (``NO_BODY`` if it takes none)."""
    label, w = operation.label, world
    if label == "POST /v1/namespaces":
        return {"name": w.fresh("ns-")}
    if label.endswith("/tokens"):
        return {"name": "t"}
    if label == "POST /v1/namespaces/{ns}/queues":
        return {
            "name": w.fresh("q-"),
            "kind": "boltzmann",
            "kindParams": {"temperature": 1.0, "priority_field": "p"},
            "admission": {"max_depth": 10, "rate_limit": 100.0, "deadline_cutoff_s": 60.0},
            "reservedSlots": 1,
            "elasticity": {"kind": "fully_elastic", "min": 0, "max": 2, "steal_delay_s": 1.0},
            "daemonTemplate": {"capacity": 2, "cloudTags": {"team": "x"}},
        }
    if operation.method == "PATCH":
        return {
            "description": "d",
            "reservedSlots": 1,
            "admission": {"deadline_cutoff_s": 60.0},
            "elasticity": {"kind": "pool_with_threshold", "pool": w.pool, "max": 2},
        }
    if label == "POST /v1/namespaces/{ns}/providers":
        return {"name": w.fresh("p-"), "kind": "fake", "config": {"launch_ttl_s": 10.0}}
    if label == "POST /v1/namespaces/{ns}/daemons":
        return {"queue": w.queue, "provider": "fk", "count": 1}
    if label.endswith("/invocations/batch"):
        return {"invocations": [{"fn": "m:f", "kwargs": {"priority": 2}}, {"fn": "m:g"}]}
    if label.endswith("/queues/{name}/invocations"):
        return {
            "fn": "m:f",
            "args": [1],
            "kwargs": {"priority": 1},
            "key": "k",
            "max_attempts": 2,
            "timeout_s": 5.0,
        }
    if label == "POST /v1/workers/hello":
        return {
            "id": w.worker,
            "queues": [w.queue],
            "runners": ["process"],
            "tags": ["t"],
            "capabilities": {
                "max_invocations": 1,
                "current_invocations": 0,
                "cost_weight": 1.0,
                "gpu": "x",
            },
            "launch_id": w.launch_id,
        }
    return {
        "claim": {"timeout_s": 0, "max": 1},
        "heartbeat": {"running": [w.running]},
        "results": {"results": [{"id": w.running, "result": {"v": 1}}], "claim": 0},
        "complete": {"result": {"v": 1}},
        "fail": {"error": {"type": "E", "message": "m", "traceback": "t"}, "retry": True},
        "stream": {"seq": 0, "items": [1, "a"]},
    }.get(operation.path.rsplit("/", 1)[-1], NO_BODY)


def no_wait(body: Any) -> Any:
    """A claim body the server takes never waits: ``timeout_s`` is 0 unless refused (the
    long poll would otherwise wait on the wall clock, up to 20 s)."""
    if not isinstance(body, dict):
        return {"timeout_s": 0} if body is None or body is NO_BODY else body
    given = body.get("timeout_s")
    try:
        wait = 20.0 if given is None else float(given)  # as the server reads it (lax)
    except (TypeError, ValueError, OverflowError):
        return body
    return {**body, "timeout_s": 0} if 0.01 < wait <= 3600 else body


@dataclass(frozen=True)
class Parts:
    """One request, by place: path segments (percent-encoded), query pairs and headers
    (raw), the body (JSON), and who asks."""

    caller: str
    segments: dict[str, str]
    query: tuple[tuple[str, str], ...] = ()
    headers: dict[str, bytes] = field(default_factory=dict)
    body: Any = NO_BODY

    def url(self, operation: Operation) -> str:
        path = operation.path
        for name, segment in self.segments.items():
            path = path.replace("{" + name + "}", segment)
        query = "&".join(f"{edges.encode(k)}={edges.encode(v)}" for k, v in self.query)
        return f"{path}?{query}" if query else path

    def with_caller(self, caller: str, world: World, odd: bytes = b"") -> Parts:
        headers = {k: v for k, v in self.headers.items() if k != "authorization"}
        token = world.token(caller)
        if token is not None:
            headers["authorization"] = f"Bearer {token}".encode()
        elif caller == "odd":
            headers["authorization"] = odd
        return replace(self, caller=caller, headers=headers)


def plain(operation: Operation, world: World) -> Parts:
    """A request the server takes, as the admin; every parameter at a seeded value."""
    segments = {}
    for param in operation.of("path"):
        segments[param.name] = (world.ids(operation, param.name) or ["x"])[0]
    body = template(operation, world) if operation.takes_body else NO_BODY
    return Parts("admin", segments, body=body).with_caller("admin", world)


def send(world: World, operation: Operation, parts: Parts) -> httpx.Response:
    headers = dict(parts.headers)
    body = no_wait(parts.body) if operation.path.endswith("/claim") else parts.body
    content = None
    if body is not NO_BODY:
        content = json.dumps(body).encode()
        headers.setdefault("content-type", b"application/json")
    return world.served.request(
        operation.method, parts.url(operation), content=content, headers=headers
    )


# --------------------------------------------------------------------------------------
# The checks
# --------------------------------------------------------------------------------------


def problem(operation: Operation, parts: Parts, response: httpx.Response) -> str | None:
    """What is wrong with the answer, if anything."""
    try:
        check(operation, parts, response)
    except AssertionError as exc:
        return f"{operation.method} {parts.url(operation)[:300]} as {parts.caller}: {exc}"
    return None


def check(operation: Operation, parts: Parts, response: httpx.Response) -> None:
    status = response.status_code
    assert status < 500, f"answered {status}: {response.text[:300]}"
    if status >= 400:
        assert_refusal(response)
        return
    if status >= 300:
        return
    if parts.caller in ("none", "odd"):
        assert operation.path in PROBES, f"answered {status} without a token"
    if parts.caller == "worker":
        assert operation.path in PROBES or operation.path.startswith(WORKER_ROUTES), (
            f"answered {status} to a worker token"
        )
    if parts.caller == "namespace":
        assert operation.label not in ADMIN_ONLY, f"answered {status} to a namespace token"
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        assert "event: end" in response.text, f"a stream cut off: {response.text[-300:]}"
