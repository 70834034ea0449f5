"""Every operation, fuzzed at its edges: path, query string, headers and body leaves.

For each operation of the published schema (``test_every_operation_is_fuzzed`` keeps the
list whole), on SQLite and PostgreSQL, against one served app per store whose seeded
records the requests aim at (``edge_targets.World``: a queue, a launched daemon's worker
holding a running invocation, a pending and a finished one, a pool with events), two
tests put the edge values of ``tests/integration/edges.py`` into requests that the server
would otherwise take (``edge_targets.plain``):

- ``test_each_edge_value_in_each_place`` sweeps, one change at a time, every ``SWEEP_*``
  value into every place: each path parameter (NUL, ``%FF``, an encoded surrogate,
  2**63, 300 characters, the empty segment, …); each query parameter, by its schema type
  (``±2**31``, ``±2**63``, ``10**400``, ``1e400``, NaN, timestamps whose UTC time leaves
  years 1-9999, NUL, ``"²"``, …) and an unknown one; each header the operation reads
  (``Last-Event-ID``: NUL, ``10**19``, …) and a hostile ``Content-Type``; the
  Authorization of every other caller — a namespace token, a launched daemon's worker
  token, none, and tokens that open nothing; and every leaf (and every object) of the
  body (NUL, a lone surrogate, ``2**31``, ``2**63``, ``10**400``, ``1e308``, NaN,
  null, ``[]``, …) and the whole body (``null``, a list, nesting 40 deep). This is what
  finds a value that breaks one place; it holds every case of issue 10's list.
- ``test_no_edge_input_gets_a_5xx`` is a bounded, derandomized Hypothesis run per
  operation that draws every place at once from ``edges``' strategies (``segments``,
  ``query_values``, ``header_values``, ``authorizations``, ``mutated``): combinations,
  and values outside the sweep (any text, any integer, any float, any bytes).

Every answer passes ``edge_targets.check``: never a 5xx (nor an exception the app let
escape), every 4xx in the error envelope, a stream answered 200 ends with its ``end``
event, nothing but the probes succeed without a token that opens something, a worker
token only on the worker routes, a namespace token never on an admin route. When a
request that succeeded has broken the seeded records (a ``bye``, a cancel, a PATCH…), they
are put back (``World.restore``) before the next, so the ids stay worth aiming at.

Nothing waits on the wall clock: a claim's ``timeout_s`` is 0 unless the server refuses
it (``edge_targets.no_wait``), and a stream is followed only on the finished invocation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from lakeshore.providers import LaunchRequest
from lakeshore.providers.fake import FakeProvider
from tests.conftest import BACKENDS
from tests.integration import edges
from tests.integration.edge_targets import (
    NO_BODY,
    Operation,
    Parts,
    World,
    operations,
    plain,
    problem,
    send,
    template,
)
from tests.integration.fuzzing import published_schema, serve_fresh

OPERATIONS = operations(published_schema())
IDS = [op.label for op in OPERATIONS]
CALLERS = ("admin", "admin", "namespace", "worker", "none", "odd")
EXAMPLES = 8
# what succeeds without touching the seeded records (checking them costs requests)
HARMLESS = frozenset(
    {
        "POST /v1/namespaces",
        "POST /v1/namespaces/{ns}/tokens",
        "POST /v1/namespaces/{ns}/queues",
        "POST /v1/namespaces/{ns}/providers",
        "POST /v1/namespaces/{ns}/daemons",
        "POST /v1/namespaces/{ns}/queues/{name}/invocations",
        "POST /v1/namespaces/{ns}/queues/{name}/invocations/batch",
        "POST /v1/admin/elasticity/tick",
        "POST /v1/workers/{worker_id}/invocations/{invocation_id}/stream",
    }
)


@pytest.fixture(scope="module", params=BACKENDS)
def world(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    """One served app per store for the module, seeded; every launch's worker token kept."""
    tokens: dict[str, str] = {}
    original = FakeProvider.launch

    async def recorded(self: FakeProvider, launch: LaunchRequest) -> dict[str, Any]:
        assert launch.token is not None
        tokens[launch.launch_id] = launch.token
        return await original(self, launch)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(FakeProvider, "launch", recorded)
        with serve_fresh(request, tmp_path_factory) as served:
            yield World.seed(served, tokens)


def _ask(world: World, operation: Operation, parts: Parts) -> str | None:
    """Send; the problem with the answer, if any; the records put back if it changed them."""
    response = send(world, operation, parts)
    found = problem(operation, parts, response)
    changed = operation.method != "GET" and operation.label not in HARMLESS
    if changed and 200 <= response.status_code < 300:
        world.restore()
    return found


# --------------------------------------------------------------------------------------
# The sweep: each edge value in each place, one at a time
# --------------------------------------------------------------------------------------

Probe = Callable[[World], Parts]


def _callers(operation: Operation, turn: int) -> Iterator[Probe]:
    for caller in ("namespace", "worker", "none"):
        yield lambda w, c=caller: plain(operation, w).with_caller(c, w)
    # two of the tokens that open nothing per operation, in turn: all of them over the run
    odd = edges.SWEEP_AUTHORIZATIONS
    for raw in (odd[(2 * turn) % len(odd)], odd[(2 * turn + 1) % len(odd)]):
        yield lambda w, r=raw: plain(operation, w).with_caller("odd", w, r)


def _places(operation: Operation) -> Iterator[Probe]:
    for param in operation.of("path"):
        for segment in edges.SWEEP_SEGMENTS:
            yield lambda w, p=param.name, s=segment: _with_segment(plain(operation, w), p, s)
    for param in operation.of("query"):
        kind = param.kind if param.kind in edges.SWEEP_QUERY else "string"
        for value in edges.SWEEP_QUERY[kind]:
            yield lambda w, p=param.name, v=value: replace(plain(operation, w), query=((p, v),))
    for pair in (("\x00", "1"), ("x", "\x00"), ("\ud800", "\ud800")):
        yield lambda w, q=pair: replace(plain(operation, w), query=(q,))
    for param in operation.of("header"):
        for raw in edges.SWEEP_HEADERS:
            yield lambda w, p=param.name, r=raw: _with_header(plain(operation, w), p, r)
    if operation.takes_body:
        for raw in edges.SWEEP_CONTENT_TYPES:
            yield lambda w, r=raw: _with_header(plain(operation, w), "content-type", r)


def _bodies(operation: Operation, world: World) -> Iterator[Probe]:
    shape = template(operation, world) if operation.takes_body else NO_BODY
    if shape is NO_BODY:
        return
    for place in edges.places(shape):
        for value in edges.SWEEP_LEAVES[edges.leaf_kind(edges.at(shape, place))]:
            yield lambda w, p=place, v=value: _with_body_leaf(plain(operation, w), p, v)
    for body in edges.SWEEP_BODIES:
        yield lambda w, b=body: replace(plain(operation, w), body=b)


def _with_segment(parts: Parts, name: str, segment: str) -> Parts:
    return replace(parts, segments={**parts.segments, name: segment})


def _with_header(parts: Parts, name: str, raw: bytes) -> Parts:
    return replace(parts, headers={**parts.headers, name: raw})


def _with_body_leaf(parts: Parts, place: tuple[Any, ...], value: Any) -> Parts:
    return replace(parts, body=edges.put(parts.body, place, value))


def test_every_operation_is_fuzzed() -> None:
    served = {
        f"{method.upper()} {path}"
        for path, methods in published_schema()["paths"].items()
        for method in methods
    }
    assert sorted(IDS) == sorted(served)


@pytest.mark.parametrize("operation", OPERATIONS, ids=IDS)
def test_each_edge_value_in_each_place(world: World, operation: Operation) -> None:
    turn = OPERATIONS.index(operation)
    probes = [*_callers(operation, turn), *_places(operation), *_bodies(operation, world)]
    problems = [found for probe in probes if (found := _ask(world, operation, probe(world)))]
    assert not problems, f"{len(problems)} of {len(probes)} probes:\n" + "\n".join(problems)


# --------------------------------------------------------------------------------------
# The random run: every place drawn at once
# --------------------------------------------------------------------------------------


def _query(operation: Operation, draw: st.DrawFn) -> tuple[tuple[str, str], ...]:
    pairs: list[tuple[str, str]] = []
    for param in operation.of("query"):
        choice = draw(st.sampled_from(["leave out", "plain", "edge", "edge"]))
        if choice == "plain":
            pairs.append((param.name, {"boolean": "true", "array": "pending"}.get(param.kind, "1")))
        elif choice == "edge":
            kind = "string" if param.kind == "array" else param.kind
            values = draw(st.lists(edges.query_values(kind), min_size=1, max_size=2))
            pairs += [(param.name, value) for value in values]
    if draw(st.integers(0, 9)) == 0:
        pairs.append((draw(edges.texts()), draw(edges.texts())))
    return tuple(pairs)


@st.composite
def drawn(draw: st.DrawFn, operation: Operation, world: World) -> Parts:
    parts = plain(operation, world)
    segments = {
        param.name: draw(edges.segments(world.ids(operation, param.name)))
        for param in operation.of("path")
    }
    caller = draw(st.sampled_from(CALLERS))
    parts = replace(parts, segments=segments, query=_query(operation, draw))
    parts = parts.with_caller(caller, world, draw(edges.authorizations()))
    headers = dict(parts.headers)
    for param in operation.of("header"):
        if draw(st.booleans()):
            headers[param.name] = draw(st.sampled_from([b"0", b"3"]) | edges.header_values())
    if draw(st.integers(0, 9)) == 0:
        headers["content-type"] = draw(edges.header_values())
    body = draw(edges.mutated(parts.body)) if parts.body is not NO_BODY else NO_BODY
    return replace(parts, headers=headers, body=body)


EDGE_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)


@pytest.mark.parametrize("operation", OPERATIONS, ids=IDS)
@EDGE_SETTINGS
@given(data=st.data())
def test_no_edge_input_gets_a_5xx(world: World, operation: Operation, data: st.DataObject) -> None:
    parts = data.draw(drawn(operation, world), label="request")
    found = _ask(world, operation, parts)
    event(f"as {parts.caller}: {'a problem' if found else 'fine'}")
    assert found is None, found
