"""Schemathesis, stateful: sequences of operations that hand each other the ids they made.

The published schema does not say that the ``id`` a hello answers is the ``{worker_id}``
of a claim, so fuzzing one operation at a time rarely reaches past a 404 on the routes
of a record made at run time. Here the schema is given OpenAPI links (``LINKS``): a
created queue's name to its reads, PATCH, lifecycle, stats, events, explain and
submits; a submitted invocation's id to its read and cancel; a hello's worker id to its
claim, heartbeat, results and bye; a claimed invocation's id (and its worker) to its
complete, fail and stream append; a registered provider's name to its read, launches and
delete. Bodies that the routes take raw (hello, submit, complete, append) are given
their models' schemas, so that generated bodies get past validation often enough to make
records for the links to follow. This schema is the test's own; the one served is
checked, whole, by ``test_api_fuzz_schema.py``.

Each run is a bounded, derandomized Hypothesis state machine as the admin, on SQLite and
PostgreSQL, with schemathesis' positive and negative generation; each scenario runs in a
namespace of its own (every ``{ns}``, and hello's ``namespace``), so that it starts from
nothing whenever Hypothesis replays it. Every answer is checked for no 5xx and, for a
4xx, the error envelope. Nothing waits on the wall clock: a claim's
``timeout_s`` and a submit's ``wait_s`` are 0, and the stream a client follows is left
out (schemathesis also infers links of its own, and one would follow a pending
invocation's stream, which does not end).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from lakeshore.api.app import create_app
from lakeshore.config import Settings
from lakeshore.services.taskqueue.workers import Hello
from tests.conftest import ADMIN
from tests.integration.edge_targets import no_wait
from tests.integration.fuzzing import BASE_URL, Served, published_schema, serve
from tests.integration.test_api_fuzz_schema import error_shape

QUEUE = "/v1/namespaces/{ns}/queues/{name}"
INVOCATION = "/v1/namespaces/{ns}/invocations/{invocation_id}"
WORKER = "/v1/workers/{worker_id}"
HELD = "/v1/workers/{worker_id}/invocations/{invocation_id}"
PROVIDER = "/v1/namespaces/{ns}/providers/{name}"
FROM_NS = "$request.path.ns"

# (producer method, path, status) -> [(consumer method, path, {parameter: expression})]
LINKS: dict[tuple[str, str, str], list[tuple[str, str, dict[str, str]]]] = {
    ("post", "/v1/namespaces/{ns}/queues", "201"): [
        (method, path, {"ns": FROM_NS, "name": "$response.body#/name"})
        for method, path in [
            ("get", QUEUE),
            ("patch", QUEUE),
            ("get", f"{QUEUE}/stats"),
            ("get", f"{QUEUE}/events"),
            ("get", f"{QUEUE}/explain"),
            ("post", f"{QUEUE}/pause"),
            ("post", f"{QUEUE}/resume"),
            ("post", f"{QUEUE}/drain"),
            ("post", f"{QUEUE}/archive"),
            ("post", f"{QUEUE}/unarchive"),
            ("post", f"{QUEUE}/invocations"),
            ("get", f"{QUEUE}/invocations"),
        ]
    ],
    ("post", f"{QUEUE}/invocations", "201"): [
        (method, path, {"ns": FROM_NS, "invocation_id": "$response.body#/id"})
        for method, path in [("get", INVOCATION), ("post", f"{INVOCATION}/cancel")]
    ],
    ("post", "/v1/workers/hello", "200"): [
        ("post", f"{WORKER}/{action}", {"worker_id": "$response.body#/id"})
        for action in ("claim", "heartbeat", "results", "bye")
    ],
    ("post", f"{WORKER}/claim", "200"): [
        (
            "post",
            f"{HELD}/{action}",
            {
                "worker_id": "$request.path.worker_id",
                "invocation_id": "$response.body#/invocations/0/id",
            },
        )
        for action in ("complete", "fail", "stream")
    ],
    ("post", "/v1/namespaces/{ns}/providers", "201"): [
        (method, path, {"ns": FROM_NS, "name": "$response.body#/name"})
        for method, path in [("get", PROVIDER), ("get", f"{PROVIDER}/launches")]
    ],
}


def _hello_schema() -> dict[str, Any]:
    schema = Hello.model_json_schema(ref_template="#/components/schemas/{model}")
    schema["properties"].pop("namespace")  # the admin's would name one that is not there
    schema["properties"].pop("launch_id")
    schema.pop("$defs", None)
    return schema


RAW_BODIES: dict[tuple[str, str], dict[str, Any]] = {
    ("post", "/v1/workers/hello"): _hello_schema(),
    ("post", f"{QUEUE}/invocations"): {
        "type": "object",
        "required": ["fn"],
        "properties": {
            "fn": {"type": "string", "pattern": "^[a-z]{1,6}:[a-z]{1,6}$"},
            "args": {"type": "array"},
            "kwargs": {"type": "object"},
            "key": {"type": "string", "minLength": 1, "maxLength": 8},
            "max_attempts": {"type": "integer", "minimum": 1, "maximum": 100},
        },
        "additionalProperties": False,
    },
    ("post", f"{HELD}/complete"): {
        "type": "object",
        "properties": {"result": {}},
        "additionalProperties": False,
    },
    ("post", f"{HELD}/stream"): {
        "type": "object",
        "required": ["seq", "items"],
        "properties": {
            "seq": {"type": "integer", "minimum": 0, "maximum": 5},
            "items": {"type": "array", "maxItems": 3},
        },
        "additionalProperties": False,
    },
}


def linked_schema() -> dict[str, Any]:
    """The published schema, with links and the raw bodies' schemas, without the stream
    a client follows."""
    schema = copy.deepcopy(published_schema())
    paths = schema["paths"]
    # following a stream ends only with its invocation: a link to it would wait forever
    # (streams are fuzzed on a finished invocation in test_api_fuzz_edges.py)
    del paths[f"{INVOCATION}/stream"]["get"]
    hello_defs = Hello.model_json_schema(ref_template="#/components/schemas/{model}")
    schema["components"]["schemas"].update(hello_defs.get("$defs", {}))
    for (method, path), body in RAW_BODIES.items():
        paths[path][method]["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": body}},
        }
    for (method, path, status), targets in LINKS.items():
        response = paths[path][method]["responses"].setdefault(status, {"description": "ok"})
        links = response.setdefault("links", {})
        for target_method, target_path, parameters in targets:
            target = paths[target_path][target_method]["operationId"]
            links[target] = {"operationId": target, "parameters": parameters}
    return schema


SCHEMA = schemathesis.openapi.from_dict(
    linked_schema(),
    config=schemathesis.Config.from_dict({"seed": 20260103, "generation": {"mode": "all"}}),
)


STATEFUL_SETTINGS = settings(
    max_examples=25,
    stateful_step_count=8,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture
def served(settings: Settings) -> Iterator[Served]:
    with serve(create_app(settings)) as served:
        yield served


def _send(served: Served, case: schemathesis.Case, ns: str) -> Any:
    if case.path_parameters and "ns" in case.path_parameters:
        case.path_parameters["ns"] = ns
    if case.path == "/v1/workers/hello" and isinstance(case.body, dict):
        case.body["namespace"] = ns
    kwargs = case.as_transport_kwargs(base_url=BASE_URL)
    headers = {k: v for k, v in (kwargs.pop("headers", None) or {}).items()}
    headers["Authorization"] = ADMIN["Authorization"]
    kwargs.pop("cookies", None)
    if isinstance(kwargs.get("data"), str | bytes):  # requests' spelling of a raw body
        kwargs["content"] = kwargs.pop("data")
    if case.path.endswith("/claim"):  # a long poll would wait on the wall clock
        kwargs.pop("content", None)
        kwargs["json"] = no_wait(kwargs.pop("json", None))
    if case.path.endswith("/invocations") and case.method.upper() == "POST":
        kwargs["params"] = {**(kwargs.get("params") or {}), "wait_s": "0"}
    return served.request(headers=headers, **kwargs)


def test_stateful_links(served: Served) -> None:
    scenarios = itertools.count()

    class Links(SCHEMA.as_state_machine()):  # type: ignore[misc]
        def setup(self) -> None:
            # each scenario in a namespace of its own: it starts from nothing, every time
            # Hypothesis replays it, as a state machine must
            self.ns = f"scenario-{next(scenarios)}"
            served.ok("POST", "/v1/namespaces", json={"name": self.ns})

        def call(self, case: schemathesis.Case, **kwargs: Any) -> schemathesis.Response:
            return schemathesis.Response.from_any(_send(served, case, self.ns))

        def validate_response(
            self, response: schemathesis.Response, case: schemathesis.Case, **kwargs: Any
        ) -> None:
            case.validate_response(response, checks=[not_a_server_error, error_shape])

    Links.run(settings=STATEFUL_SETTINGS)
