"""Fuzzing the HTTP API: whatever a caller sends, the answer is never a 5xx.

Three layers, each on SQLite and PostgreSQL:

1. Schemathesis drives every operation of the published schema (``/openapi.json``) as
   the admin, as a namespace's token, with no token and with a bad one. The app runs in
   an event loop of the test's own (an anyio blocking portal) with its lifespan entered
   once per test, so the store it migrates and the requests share one loop.
2. Hypothesis property tests of queue create and PATCH with bodies from a strategy that
   mixes nearly-valid queue specs with arbitrary JSON: never a 5xx, every refusal in the
   error shape, what a 201/200 returns is what a GET reads back, a refusal changes nothing.
3. Raw-bytes edge cases: malformed JSON, NaN, deep nesting, oversized and chunked bodies,
   wrong content type, unknown routes and methods, bad query values.

What fuzzing once found (out-of-range counts, lone surrogates, deep nesting, floats that
PostgreSQL's jsonb rewrote) has a minimal reproduction at the end as a regression test.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import schemathesis
from anyio.from_thread import BlockingPortal, start_blocking_portal
from asgi_lifespan import LifespanManager
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.parameters import ParameterLocation
from schemathesis.generation.meta import CoveragePhaseData, TestPhase

from lakeshore.api.app import create_app
from lakeshore.config import Settings
from lakeshore.domain.names import NAME_RE
from lakeshore.domain.queue import ELASTICITY_KINDS, QUEUE_KINDS
from tests.conftest import ADMIN, ADMIN_TOKEN

BASE_URL = "http://lakeshore.test"
QUEUES = "/v1/namespaces/default/queues"


# --------------------------------------------------------------------------------------
# Shared: the refusal shape, and sending through the `api` fixture
# --------------------------------------------------------------------------------------


def assert_refusal(response: httpx.Response, status: int | None = None) -> dict[str, Any]:
    """A 4xx (``status`` if given) whose body is ``{"error": {"code", "message", ...}}``."""
    assert 400 <= response.status_code < 500, f"{response.status_code}: {response.text[:500]}"
    if status is not None:
        assert response.status_code == status, response.text[:500]
    body = response.json()
    assert isinstance(body, dict), body
    assert list(body) == ["error"], body
    error = body["error"]
    assert isinstance(error, dict), body
    assert isinstance(error.get("code"), str), body
    assert isinstance(error.get("message"), str), body
    assert isinstance(error.get("field", ""), str), body
    return dict(error)


NO_BODY: Any = object()


def json_bytes(value: Any) -> bytes:
    """JSON as a client library would send it (NaN as ``NaN``, lone surrogates escaped)."""
    return json.dumps(value).encode()


async def send(
    api: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    body: Any = NO_BODY,
    content: Any = None,
    headers: dict[str, str] | None = None,
    params: dict[str, str] | None = None,
) -> httpx.Response:
    """One request; a 5xx, or an exception the app let escape, fails the test."""
    if body is not NO_BODY:
        content = json_bytes(body)
        headers = {"content-type": "application/json", **(headers or {})}
    try:
        response = await api.request(method, url, content=content, headers=headers, params=params)
    except Exception as exc:  # the `api` fixture's transport re-raises what the app did not handle
        raise AssertionError(
            f"{method} {url} answered 500: unhandled {type(exc).__name__}: {exc}"
        ) from exc
    assert response.status_code < 500, (
        f"{method} {url} answered {response.status_code}: {response.text[:500]}"
    )
    return response


def queue_url(name: str, ns: str = "default") -> str:
    return f"/v1/namespaces/{ns}/queues/{quote(name, safe='')}"


async def listing(api: httpx.AsyncClient) -> Any:
    response = await send(api, "GET", QUEUES, params={"include_archived": "true"})
    assert response.status_code == 200, response.text
    return response.json()


# --------------------------------------------------------------------------------------
# 1. Schemathesis over the published schema
# --------------------------------------------------------------------------------------


def _published_schema() -> dict[str, Any]:
    # What the app serves at /openapi.json (checked below); building it runs no lifespan,
    # so nothing is migrated at import time.
    app = create_app(Settings(database_url="sqlite://", admin_token=ADMIN_TOKEN))
    return app.openapi()


RAW_SCHEMA = _published_schema()
# As the admin: every phase (explicit examples, coverage of boundaries, random fuzzing).
SCHEMA = schemathesis.openapi.from_dict(
    RAW_SCHEMA,
    config=schemathesis.Config.from_dict({"seed": 20260101, "generation": {"mode": "all"}}),
)
# As other callers: most requests stop at authentication, so fuzzing alone is enough.
CALLER_SCHEMA = schemathesis.openapi.from_dict(
    RAW_SCHEMA,
    config=schemathesis.Config.from_dict(
        {
            "seed": 20260102,
            "generation": {"mode": "all"},
            "phases": {"examples": {"enabled": False}, "coverage": {"enabled": False}},
        }
    ),
)

OTHER_NAMESPACE = "team-a"
SEEDED_NAMESPACES = ("default", OTHER_NAMESPACE)
SEEDED_QUEUES = ("alpha", "beta", "gamma", "delta")  # active, elastic, paused, archived
ADMIN_ONLY = {"POST /v1/namespaces", "POST /v1/namespaces/{ns}/tokens"}
VALID_NAME = st.from_regex(NAME_RE, fullmatch=True)
_coverage_counter = itertools.count()


def _aim(case: schemathesis.Case, ns: str, queue: str, fresh_name: str) -> schemathesis.Case:
    """Point ``case`` at records that exist; in a valid case, use names the domain accepts.

    The published schema cannot say what a queue name looks like (the rule is a
    validator, not a pattern), so generated names are nearly always refused; and a PATCH
    that names another queue is a refused rename.
    """
    params = case.path_parameters or {}
    if "ns" in params:
        params["ns"] = ns
    if "name" in params:
        params["name"] = queue
    positive = case.meta is None or case.meta.generation.mode == GenerationMode.POSITIVE
    if positive and isinstance(case.body, dict) and "name" in case.body:
        if case.method.upper() == "POST" and case.path.endswith("/queues"):
            case.body["name"] = fresh_name
        elif case.method.upper() == "PATCH":
            case.body["name"] = queue
    return case


def map_case(context: schemathesis.HookContext, case: schemathesis.Case) -> schemathesis.Case:
    """Coverage cases that probe a body or a query go to real records, not random paths."""
    meta = case.meta
    if meta is None or meta.phase.name != TestPhase.COVERAGE:
        return case
    data = meta.phase.data
    if isinstance(data, CoveragePhaseData) and data.parameter_location == ParameterLocation.PATH:
        return case
    n = next(_coverage_counter)
    ns = SEEDED_NAMESPACES[n // len(SEEDED_QUEUES) % len(SEEDED_NAMESPACES)]
    return _aim(case, ns, SEEDED_QUEUES[n % len(SEEDED_QUEUES)], f"cov-{n}")


def flatmap_case(
    context: schemathesis.HookContext, case: schemathesis.Case
) -> st.SearchStrategy[schemathesis.Case]:
    """Fuzzed cases: half aimed at seeded records, half left as generated."""
    if case.meta is not None and case.meta.phase.name != TestPhase.FUZZING:
        return st.just(case)
    aimed = st.builds(
        _aim,
        st.just(case),
        st.sampled_from(SEEDED_NAMESPACES),
        st.sampled_from(SEEDED_QUEUES),
        VALID_NAME,
    )
    return st.one_of(st.just(case), aimed)


for _schema in (SCHEMA, CALLER_SCHEMA):
    _schema.hook(map_case)
    _schema.hook(flatmap_case)


@dataclass
class Served:
    """The app with its lifespan entered, reached through an httpx client in its own loop."""

    portal: BlockingPortal
    client: httpx.AsyncClient
    namespace_token: str = ""

    def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        return self.portal.call(functools.partial(self.client.request, method, url, **kwargs))

    def ok(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        response = self.request(method, url, headers=ADMIN, **kwargs)
        assert response.status_code in (200, 201), response.text
        return response


def _seed(served: Served) -> None:
    """The same four queues (active, elastic, paused, archived) in two namespaces."""
    served.ok("POST", "/v1/namespaces", json={"name": OTHER_NAMESPACE})
    for ns in SEEDED_NAMESPACES:
        queues = f"/v1/namespaces/{ns}/queues"
        served.ok("POST", queues, json={"name": "alpha"})
        beta = {
            "name": "beta",
            "kind": "priority",
            "elasticity": {"kind": "pool_with_threshold", "pool": "p1", "max": 3},
            "daemonTemplate": {"capacity": 2, "cloudTags": {"team": "x"}},
        }
        served.ok("POST", queues, json=beta)
        served.ok("POST", queues, json={"name": "gamma"})
        served.ok("POST", f"{queues}/gamma/pause")
        served.ok("POST", queues, json={"name": "delta"})
        served.ok("POST", f"{queues}/delta/archive")
    token = served.ok("POST", f"/v1/namespaces/{OTHER_NAMESPACE}/tokens", json={"name": "fuzz"})
    served.namespace_token = str(token.json()["token"])


async def _lifespan(app: Any) -> LifespanManager:
    return LifespanManager(app)  # made in the loop: it detects the async library when built


@pytest.fixture
def served(settings: Settings) -> Iterator[Served]:
    app = create_app(settings)
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(portal.call(_lifespan, app)) as manager,
        portal.wrap_async_context_manager(
            httpx.AsyncClient(
                # a 500 must come back as a response, not as an exception in the test
                transport=httpx.ASGITransport(app=manager.app, raise_app_exceptions=False),
                base_url=BASE_URL,
            )
        ) as client,
    ):
        served = Served(portal=portal, client=client)
        _seed(served)
        yield served


def _send_case(
    served: Served, case: schemathesis.Case, authorization: str | None
) -> httpx.Response:
    kwargs = case.as_transport_kwargs(base_url=BASE_URL)
    generated = kwargs.pop("headers", None) or {}
    headers = {k: v for k, v in generated.items() if k.lower() != "authorization"}
    if authorization is not None:
        headers["Authorization"] = authorization
    kwargs.pop("cookies", None)
    if isinstance(kwargs.get("data"), str | bytes):  # requests' spelling of a raw body
        kwargs["content"] = kwargs.pop("data")
    return served.request(headers=headers, **kwargs)


def error_shape(ctx: Any, response: schemathesis.Response, case: schemathesis.Case) -> bool:
    """Every 4xx carries ``{"error": {"code": str, "message": str, ...}}``."""
    if 400 <= response.status_code < 500:
        body = response.json()
        assert list(body) == ["error"], body
        assert isinstance(body["error"]["code"], str), body
        assert isinstance(body["error"]["message"], str), body
    return True


def nothing_without_a_token(
    ctx: Any, response: schemathesis.Response, case: schemathesis.Case
) -> bool:
    """No token, or a token that opens nothing, gets nothing but the health check."""
    if case.operation.path != "/healthz":
        assert response.status_code >= 400, f"{case.operation.label} answered without a token"
    return True


def only_its_own_namespace(
    ctx: Any, response: schemathesis.Response, case: schemathesis.Case
) -> bool:
    """A namespace token succeeds only inside its namespace, and never on admin routes."""
    if response.status_code >= 400 or case.operation.path == "/healthz":
        return True
    label = case.operation.label
    assert label not in ADMIN_ONLY, f"{label} succeeded with a namespace token"
    ns = (case.path_parameters or {}).get("ns")
    if ns is not None:
        assert ns == OTHER_NAMESPACE, f"{label} succeeded in namespace {ns!r}"
    if label == "GET /v1/namespaces":
        assert [n["name"] for n in response.json()["namespaces"]] == [OTHER_NAMESPACE]
    return True


SCHEMATHESIS_SETTINGS: dict[str, Any] = {
    "deadline": None,
    "derandomize": True,
    "database": None,
    "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
}


def test_the_fuzzed_schema_is_the_one_served(served: Served) -> None:
    response = served.request("GET", "/openapi.json")
    assert response.status_code == 200
    assert response.json() == RAW_SCHEMA


@SCHEMA.parametrize()
@settings(max_examples=30, **SCHEMATHESIS_SETTINGS)
def test_schema_fuzz_as_admin(case: schemathesis.Case, served: Served) -> None:
    response = _send_case(served, case, f"Bearer {ADMIN_TOKEN}")
    case.validate_response(response, checks=[not_a_server_error, error_shape])


CALLERS = ("namespace-token", "no-token", "bad-token")


@CALLER_SCHEMA.parametrize()
@CALLER_SCHEMA.given(caller=st.sampled_from(CALLERS))
@settings(max_examples=24, **SCHEMATHESIS_SETTINGS)
def test_schema_fuzz_as_other_callers(case: schemathesis.Case, caller: str, served: Served) -> None:
    authorization = {
        "namespace-token": f"Bearer {served.namespace_token}",
        "no-token": None,
        "bad-token": "Bearer lks_0123456789abcdef_not-a-secret-we-issued",
    }[caller]
    response = _send_case(served, case, authorization)
    access = only_its_own_namespace if caller == "namespace-token" else nothing_without_a_token
    case.validate_response(response, checks=[not_a_server_error, error_shape, access])


# --------------------------------------------------------------------------------------
# 2. Hypothesis properties of queue create and PATCH
# --------------------------------------------------------------------------------------
#
# A body is either a valid queue with zero to two fields mutated into something odd (so
# that many reach the store), a spec-shaped object whose every field is random, or any
# JSON value at all. With ``full=True`` (what the properties run) the strategies also
# draw the inputs behind the regressions at the end of this file — lone surrogates,
# reservedSlots beyond a 32-bit integer, free-form JSON nested 256 deep, free-form floats
# of 2**53 or more — and a third of the valid bodies carry one of them; ``full=False``
# leaves them out (handy when chasing something else).

HUGE_INTS = (2**31 - 1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 10**30, -(2**63) - 1)
SAFE_HUGE_INTS = (2**31 - 1, -(2**31), 10**30)
SURROGATES = ("\ud800", "a\udfffb", "fully-elastic\udbff")
HYPHENATED_KINDS = tuple(kind.replace("_", "-") for kind in ELASTICITY_KINDS if "_" in kind)
ODD_KINDS = ("Fixed", " fixed", "FULLY_ELASTIC", "elastic", "", "pool_with_threshold ")
LABEL = st.text(min_size=1, max_size=16).filter(lambda s: "\x00" not in s)


@functools.cache
def texts(full: bool) -> st.SearchStrategy[str]:
    plain = st.text(max_size=12)
    if not full:
        return plain
    alphabet = st.characters() | st.characters(categories=["Cs"])
    return st.one_of(plain, st.text(alphabet, max_size=12), st.sampled_from(SURROGATES))


@functools.cache
def json_values(full: bool) -> st.SearchStrategy[Any]:
    """Arbitrary JSON, NaN and infinities included (the API must refuse those cleanly)."""
    if full:
        floats = st.floats()
    else:
        floats = st.floats(min_value=-(2**53) + 1, max_value=2**53 - 1) | st.sampled_from(
            [math.nan, math.inf, -math.inf]
        )
    scalars = st.none() | st.booleans() | st.integers() | floats | texts(full)
    values = st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts(full), inner, max_size=4),
        max_leaves=12,
    )
    if full:
        deep = st.integers(min_value=256, max_value=300).map(
            lambda depth: json.loads("[" * depth + "]" * depth)
        )
        values = st.one_of(values, deep)
    return values


@functools.cache
def finite_json(full: bool) -> st.SearchStrategy[Any]:
    """Free-form JSON the domain accepts (no NaN, no infinities, no NUL)."""
    return json_values(full).filter(lambda value: _is_storable(value))


def _is_storable(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, str):
        return "\x00" not in value
    if isinstance(value, list):
        return all(_is_storable(item) for item in value)
    if isinstance(value, dict):
        return all(_is_storable(k) and _is_storable(v) for k, v in value.items())
    return True


@functools.cache
def numbers(full: bool) -> st.SearchStrategy[Any]:
    """What a count or a fraction may be sent as: anything number-like, and worse."""
    return st.one_of(
        st.integers(min_value=-3, max_value=12),
        st.integers(),
        st.sampled_from(HUGE_INTS if full else SAFE_HUGE_INTS),
        st.floats(),
        st.floats(min_value=0, max_value=1),
        st.booleans(),
        st.text(max_size=4),
        st.none(),
    )


def _fits_an_int32_column(value: Any) -> bool:
    return not isinstance(value, int) or isinstance(value, bool) or value < 2**31


@functools.cache
def names(full: bool) -> st.SearchStrategy[Any]:
    return st.one_of(
        VALID_NAME,
        st.sampled_from(["alpha", "beta", "q-1", "q.2", "q_3"]),  # collisions and re-creates
        texts(full),
        json_values(full),
    )


@functools.cache
def any_kinds(full: bool) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.sampled_from(ELASTICITY_KINDS),
        st.sampled_from(HYPHENATED_KINDS),
        st.sampled_from(ODD_KINDS),
        texts(full),
        json_values(full),
    )


@st.composite
def valid_elasticity(draw: st.DrawFn, full: bool) -> dict[str, Any]:
    kind = draw(st.sampled_from(ELASTICITY_KINDS))
    spec: dict[str, Any] = {"kind": kind}
    if draw(st.booleans()):
        low = draw(st.integers(0, 20) | st.just(10**30))
        spec["min"] = low
        if draw(st.booleans()):
            spec["max"] = low + draw(st.integers(0, 20))
    elif draw(st.booleans()):
        spec["max"] = draw(st.integers(0, 10**20))
    if draw(st.booleans()):
        high = draw(st.floats(min_value=0.05, max_value=1))
        spec["threshold"] = high
        if draw(st.booleans()):
            spec["threshold_low"] = draw(st.floats(0.01, high, exclude_max=True))
    elif draw(st.booleans()):
        spec["threshold_low"] = draw(st.floats(0.01, 0.79))
    if draw(st.booleans()):
        spec["pool"] = draw(VALID_NAME)
    if draw(st.booleans()):
        spec["match"] = {"tags": draw(st.lists(LABEL, max_size=3))}
    if draw(st.booleans()):
        spec["steal_delay_s"] = draw(st.floats(min_value=0, max_value=1e6))
    # unknown keys are kept and ignored (forward compatibility)
    extra = draw(st.dictionaries(st.sampled_from(["future_knob", "x", "_y"]), finite_json(full)))
    return {**extra, **spec}


@functools.cache
def valid_fields(full: bool) -> dict[str, st.SearchStrategy[Any]]:
    """Every writable field of a queue, drawn from values the domain accepts."""
    slots = st.integers(0, 2**31 - 1)
    if full:
        slots = slots | st.sampled_from([2**31, 2**63, 10**30])
    return {
        "description": st.text(max_size=40).filter(lambda s: "\x00" not in s),
        "kind": st.sampled_from(QUEUE_KINDS),
        "kindParams": st.fixed_dictionaries(
            {},
            optional={
                "temperature": st.floats(min_value=1e-6, max_value=1e6),
                "priority_field": LABEL,
            },
        ),
        "admission": st.fixed_dictionaries(
            {},
            optional={
                "max_depth": st.integers(1, 10**6),
                "on_full": st.sampled_from(["reject", "block"]),
                "rate_limit": st.floats(min_value=0.1, max_value=1e4),
                "deadline_cutoff_s": st.floats(min_value=0.1, max_value=1e4),
            },
        ),
        "reservedSlots": slots,
        "authPolicy": finite_json(full),
        "providerRef": VALID_NAME,
        "elasticity": valid_elasticity(full),
        "daemonTemplate": st.fixed_dictionaries(
            {},
            optional={
                "instance_type": LABEL,
                "image_id": LABEL,
                "runners": st.lists(LABEL, max_size=3),
                "capacity": st.integers(1, 100_000),
                "cloudTags": st.dictionaries(LABEL, LABEL, max_size=3),
                "bootstrap_script": st.text(max_size=40).filter(lambda s: "\x00" not in s),
                "setup_scripts": st.lists(LABEL, max_size=2),
                "provider": VALID_NAME,
            },
        ),
        "customScalerUdf": st.sampled_from(["pkg.mod:fn", "a:b.c", "_x.y:z"]),
        "serverNodeId": LABEL,
    }


@functools.cache
def mutations(full: bool) -> tuple[tuple[tuple[str, ...], st.SearchStrategy[Any]], ...]:
    """Where a valid queue can be broken, and what to break it with."""
    text, free, number = texts(full), json_values(full), numbers(full)
    return (
        (("name",), names(full)),
        (("description",), text | free),
        (("kind",), text | free),
        (("kindParams", "temperature"), number),
        (("admission", "max_depth"), number),
        (("admission", "on_full"), text | free),
        (("reservedSlots",), number if full else number.filter(_fits_an_int32_column)),
        (("authPolicy",), free),
        (("providerRef",), names(full)),
        (("elasticity",), free),
        (("elasticity", "kind"), any_kinds(full)),
        (("elasticity", "min"), number),
        (("elasticity", "max"), number),
        (("elasticity", "threshold"), number),
        (("elasticity", "threshold_low"), number),
        (("elasticity", "pool"), names(full)),
        (("elasticity", "match"), free),
        (("elasticity", "future_knob"), free),
        (("daemonTemplate",), free),
        (("daemonTemplate", "capacity"), number),
        (("daemonTemplate", "cloudTags"), st.dictionaries(text, text | free, max_size=3)),
        (("daemonTemplate", "runners"), free),
        (("daemonTemplate", "instanceType"), text),  # nested fields are snake_case
        (("customScalerUdf",), text | free),
        (("serverNodeId",), text | free),
        (("state",), st.sampled_from(["active", "paused", "archived"]) | free),
        (("id",), text),
        (("unknownField",), free),
    )


def _put(body: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = body
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {"kind": "fixed"} if key == "elasticity" else {}
        node = node[key]
    node[path[-1]] = value


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy[dict[str, Any]], full: bool) -> Any:
    body = draw(base)
    for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):
        path, values = draw(st.sampled_from(mutations(full)))
        _put(body, path, draw(values))
    return body


@functools.cache
def hostile_values() -> tuple[tuple[tuple[str, ...], st.SearchStrategy[Any]], ...]:
    """The values behind the known bugs, each where the domain accepts it."""
    deep = st.integers(min_value=256, max_value=300).map(
        lambda depth: json.loads("[" * depth + "]" * depth)
    )
    odd = st.one_of(st.sampled_from(SURROGATES), deep, st.sampled_from([1e23, -1.5e300]))
    return (
        (("authPolicy",), odd),
        (("authPolicy",), st.dictionaries(st.sampled_from(SURROGATES), st.integers(), min_size=1)),
        (("elasticity", "future_knob"), odd),
        (("reservedSlots",), st.sampled_from([2**31, 2**63, 10**30])),
        (("elasticity", "kind"), st.sampled_from(SURROGATES)),
    )


@st.composite
def hostile(draw: st.DrawFn, base: st.SearchStrategy[dict[str, Any]]) -> Any:
    body = draw(base)
    path, values = draw(st.sampled_from(hostile_values()))
    _put(body, path, draw(values))
    return body


@functools.cache
def wild_fields(full: bool) -> dict[str, st.SearchStrategy[Any]]:
    """Every field at once drawn from anything: the mutations, as a whole spec."""
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for path, values in mutations(full):
        if len(path) == 1 and path[0] not in ("name", "id", "state"):
            fields[path[0]] = values
    fields["elasticity"] = fields["elasticity"] | st.fixed_dictionaries(
        {"kind": any_kinds(full)},
        optional={key: numbers(full) for key in ("min", "max", "threshold", "threshold_low")},
    )
    return fields


@functools.cache
def queue_bodies(full: bool) -> st.SearchStrategy[Any]:
    valid = st.fixed_dictionaries({"name": VALID_NAME}, optional=valid_fields(full))
    wild = st.fixed_dictionaries({"name": names(full)}, optional=wild_fields(full))
    return _mix(valid, wild, full)


def _mix(
    valid: st.SearchStrategy[dict[str, Any]], wild: st.SearchStrategy[Any], full: bool
) -> st.SearchStrategy[Any]:
    """Mostly valid bodies with a mutation or two; in ``full``, as many carrying a known bug."""
    nearly_valid = mutated(valid, full)
    branches = [nearly_valid, nearly_valid, nearly_valid, wild, json_values(full)]
    if full:
        branches += [hostile(valid), hostile(valid), hostile(valid)]
    return st.one_of(branches)


PATCH_TARGETS = ("p-plain", "p-elastic", "p-paused", "p-archived", "p-missing")


@functools.cache
def patch_bodies(full: bool, target: str) -> st.SearchStrategy[Any]:
    # a valid PATCH names some fields; null clears one; the name, if given, is unchanged
    valid_optional = {key: values | st.none() for key, values in valid_fields(full).items()}
    valid_optional["name"] = st.just(target)
    valid = st.fixed_dictionaries({}, optional=valid_optional)
    wild_optional = {key: values | st.none() for key, values in wild_fields(full).items()}
    wild_optional["name"] = st.just(target) | names(full) | st.none()
    wild = st.fixed_dictionaries({}, optional=wild_optional)
    return _mix(valid, wild, full)


@functools.cache
def patches(full: bool) -> st.SearchStrategy[tuple[str, Any]]:
    # most PATCHes go to queues that can change
    targets = st.sampled_from(PATCH_TARGETS[:3] * 3 + PATCH_TARGETS[3:])
    return targets.flatmap(lambda target: st.tuples(st.just(target), patch_bodies(full, target)))


PROPERTY_SETTINGS = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)


async def check_create(api: httpx.AsyncClient, body: Any) -> None:
    name = body.get("name") if isinstance(body, dict) else None
    probe = name if isinstance(name, str) and NAME_RE.fullmatch(name) else None
    before_list = await listing(api)
    before = await send(api, "GET", queue_url(probe)) if probe else None

    response = await send(api, "POST", QUEUES, body=body)
    event(f"create answered {response.status_code}")  # see --hypothesis-show-statistics

    if response.status_code == 201:
        assert probe is not None, f"created a queue named {name!r}"
        assert before is not None and before.status_code == 404, "created over an existing queue"
        record = response.json()
        got = await send(api, "GET", queue_url(probe))
        assert got.status_code == 200, got.text
        assert got.json() == record
        return
    assert_refusal(response)
    assert await listing(api) == before_list, "a refused create changed the queue list"
    if probe is not None and before is not None:
        after = await send(api, "GET", queue_url(probe))
        assert (after.status_code, after.json()) == (before.status_code, before.json())


async def seed_patch_targets(api: httpx.AsyncClient) -> None:
    if (await send(api, "GET", queue_url("p-plain"))).status_code == 200:
        return
    for body in (
        {"name": "p-plain"},
        {"name": "p-elastic", "elasticity": {"kind": "fully_elastic", "min": 1, "max": 5}},
        {"name": "p-paused", "kind": "priority", "reservedSlots": 2},
        {"name": "p-archived"},
    ):
        assert (await send(api, "POST", QUEUES, body=body)).status_code == 201
    assert (await send(api, "POST", f"{queue_url('p-paused')}/pause")).status_code == 200
    assert (await send(api, "POST", f"{queue_url('p-archived')}/archive")).status_code == 200


async def check_patch(api: httpx.AsyncClient, target: str, patch: Any) -> None:
    await seed_patch_targets(api)
    before = await send(api, "GET", queue_url(target))

    response = await send(api, "PATCH", queue_url(target), body=patch)
    event(f"PATCH {target} answered {response.status_code}")

    after = await send(api, "GET", queue_url(target))
    if response.status_code == 200:
        record = response.json()
        assert before.status_code == 200
        assert after.status_code == 200 and after.json() == record
        old = before.json()
        for key in ("id", "namespaceId", "name", "state", "createdAt"):
            assert record[key] == old[key], key
        assert isinstance(patch, dict)
        for key, value in old.items():  # what the PATCH did not name is kept as it was
            if key not in patch and key != "updatedAt":
                assert record.get(key) == value, key
        return
    assert_refusal(response)
    assert (after.status_code, after.json()) == (before.status_code, before.json())


@PROPERTY_SETTINGS
@given(data=st.data())
async def test_queue_create_property(api: httpx.AsyncClient, data: st.DataObject) -> None:
    await check_create(api, data.draw(queue_bodies(True), label="body"))


@PROPERTY_SETTINGS
@given(data=st.data())
async def test_queue_patch_property(api: httpx.AsyncClient, data: st.DataObject) -> None:
    await check_patch(api, *data.draw(patches(True), label="target, patch"))


# --------------------------------------------------------------------------------------
# 3. Raw bytes
# --------------------------------------------------------------------------------------

JSON = {"content-type": "application/json"}


async def test_malformed_json_is_400(api: httpx.AsyncClient) -> None:
    for raw in (b"{", b'{"name": "x",}', b"nul", b"\xff\xfe", b'{"name": "\xff"}'):
        response = await send(api, "POST", QUEUES, content=raw, headers=JSON)
        assert_refusal(response, 400)
    response = await send(api, "POST", QUEUES, content=b"{", headers=JSON)
    assert assert_refusal(response, 400)["code"] == "invalid_json"


@pytest.mark.parametrize(
    "raw",
    [
        b'{"name": "n", "authPolicy": NaN}',
        b'{"name": "n", "authPolicy": {"a": [1, -Infinity]}}',
        b'{"name": "n", "elasticity": {"kind": "fixed", "threshold": Infinity}}',
        b'{"name": "n", "elasticity": {"kind": "fixed", "future_knob": NaN}}',
        b'{"name": "n", "kindParams": {"temperature": NaN}}',
    ],
)
async def test_nan_and_infinity_in_a_queue_are_422(api: httpx.AsyncClient, raw: bytes) -> None:
    response = await send(api, "POST", QUEUES, content=raw, headers=JSON)
    assert assert_refusal(response, 422)["code"] == "invalid"
    assert (await send(api, "GET", queue_url("n"))).status_code == 404


async def test_nan_in_a_patch_is_422(api: httpx.AsyncClient) -> None:
    assert (await send(api, "POST", QUEUES, body={"name": "n"})).status_code == 201
    raw = b'{"elasticity": {"kind": "fixed", "threshold": NaN}}'
    assert_refusal(await send(api, "PATCH", queue_url("n"), content=raw, headers=JSON), 422)


@pytest.mark.parametrize(
    "raw",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
        b'{"name": "deep", "authPolicy": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    ],
    ids=["array", "object", "inside-a-queue"],
)
async def test_a_100k_deep_body_is_a_4xx(api: httpx.AsyncClient, raw: bytes) -> None:
    assert len(raw) < 1 << 20
    for method, url in (("POST", QUEUES), ("PATCH", queue_url("deep"))):
        assert_refusal(await send(api, method, url, content=raw, headers=JSON))
    assert (await send(api, "GET", queue_url("deep"))).status_code == 404


async def test_a_body_over_1_mib_is_413(api: httpx.AsyncClient) -> None:
    body = json_bytes({"name": "big", "description": "x" * (1 << 20)})
    response = await send(api, "POST", QUEUES, content=body, headers=JSON)
    assert assert_refusal(response, 413)["code"] == "payload_too_large"


async def test_a_chunked_body_over_1_mib_is_413(api: httpx.AsyncClient) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"name": "big", "description": "'
        for _ in range(12):
            yield b"x" * 100_000
        yield b'"}'

    response = await send(api, "POST", QUEUES, content=chunks(), headers=JSON)
    assert "content-length" not in response.request.headers
    assert assert_refusal(response, 413)["code"] == "payload_too_large"
    assert (await send(api, "GET", queue_url("big"))).status_code == 404


async def test_a_chunked_body_under_the_cap_is_read(api: httpx.AsyncClient) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"name": "chunked", '
        yield b'"description": "' + b"x" * 1000 + b'"}'

    response = await send(api, "POST", QUEUES, content=chunks(), headers=JSON)
    assert response.status_code == 201, response.text


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "application/xml", "image/png"],
)
async def test_a_wrong_content_type_is_a_4xx(api: httpx.AsyncClient, content_type: str) -> None:
    body = json_bytes({"name": "typed"})
    headers = {"content-type": content_type}
    for method, url in (("POST", QUEUES), ("POST", "/v1/namespaces")):
        response = await send(api, method, url, content=body, headers=headers)
        assert_refusal(response)
        # today the body is read as bytes and refused as not an object (415 would be apter)
        assert response.status_code in (415, 422), response.text
    assert (await send(api, "GET", queue_url("typed"))).status_code == 404


@pytest.mark.parametrize(("declared", "status"), [("abc", 400), ("-1", 400), (str(2 << 20), 413)])
async def test_a_bad_content_length_is_refused_before_the_body_is_read(
    api: httpx.AsyncClient, declared: str, status: int
) -> None:
    headers = {**JSON, "content-length": declared}
    response = await send(api, "POST", QUEUES, content=b'{"name": "cl"}', headers=headers)
    assert_refusal(response, status)
    assert (await send(api, "GET", queue_url("cl"))).status_code == 404


async def test_an_unknown_route_is_404(api: httpx.AsyncClient) -> None:
    for method, url in (
        ("GET", "/nope"),
        ("POST", "/v1/queues"),
        ("GET", "/v1/namespaces/default/queues/alpha/nothing-here"),
    ):
        response = await send(api, method, url)
        assert assert_refusal(response, 404)["code"] == "not_found"


async def test_a_wrong_method_is_405(api: httpx.AsyncClient) -> None:
    for method, url in (
        ("DELETE", QUEUES),
        ("PUT", queue_url("alpha")),
        ("GET", f"{queue_url('alpha')}/drain"),
        ("POST", "/healthz"),
    ):
        response = await send(api, method, url)
        assert assert_refusal(response, 405)["code"] == "method_not_allowed"


@pytest.mark.parametrize("value", ["notabool", "", "2", "truee", "\u00e9"])
async def test_a_bad_include_archived_is_422(api: httpx.AsyncClient, value: str) -> None:
    response = await send(api, "GET", QUEUES, params={"include_archived": value})
    error = assert_refusal(response, 422)
    assert error["field"] == "include_archived"


async def test_an_empty_or_null_body_is_refused(api: httpx.AsyncClient) -> None:
    assert (await send(api, "POST", QUEUES, body={"name": "n"})).status_code == 201
    for raw in (b"", b"null", b"[]", b'"n"', b"1"):
        assert_refusal(await send(api, "POST", QUEUES, content=raw, headers=JSON), 422)
        assert_refusal(await send(api, "PATCH", queue_url("n"), content=raw, headers=JSON), 422)


# --------------------------------------------------------------------------------------
# Regressions: minimal reproductions of what fuzzing once found
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("slots", [2**31, 2**63], ids=["2**31", "2**63"])
async def test_regression_reserved_slots_beyond_the_column(
    api: httpx.AsyncClient, slots: int
) -> None:
    response = await send(api, "POST", QUEUES, body={"name": "slots", "reservedSlots": slots})
    assert_refusal(response, 422)
    assert (await send(api, "POST", QUEUES, body={"name": "ok"})).status_code == 201
    patch = await send(api, "PATCH", queue_url("ok"), body={"reservedSlots": slots})
    assert_refusal(patch, 422)


@pytest.mark.parametrize(
    "body",
    [
        {"name": "sur", "authPolicy": "\ud800"},
        {"name": "sur", "elasticity": {"kind": "fixed", "future_knob": ["\udfff"]}},
    ],
    ids=["authPolicy", "elasticity-extra"],
)
async def test_regression_lone_surrogate_in_free_form_json(
    api: httpx.AsyncClient, body: dict[str, Any]
) -> None:
    problems: list[str] = []
    try:
        assert_refusal(await send(api, "POST", QUEUES, body=body), 422)
    except AssertionError as exc:
        problems.append(f"create: {exc}")
    for url in (queue_url("sur"), QUEUES):  # what a 500 left behind
        try:
            await send(api, "GET", url)
        except AssertionError as exc:
            problems.append(f"afterwards: {exc}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    "body",
    [
        {"name": "echo", "elasticity": {"kind": "\ud800"}},
        {"name": "echo", "authPolicy": {"\ud800": "\x00"}},
    ],
    ids=["elasticity-kind", "nul-path"],
)
async def test_regression_lone_surrogate_echoed_in_a_refusal(
    api: httpx.AsyncClient, body: dict[str, Any]
) -> None:
    assert_refusal(await send(api, "POST", QUEUES, body=body), 422)
    assert (await send(api, "POST", QUEUES, body={"name": "echo"})).status_code == 201
    patch = {key: value for key, value in body.items() if key != "name"}
    assert_refusal(await send(api, "PATCH", queue_url("echo"), body=patch), 422)


@pytest.mark.parametrize("method", ["POST", "PATCH"])
async def test_regression_deep_free_form_json(api: httpx.AsyncClient, method: str) -> None:
    deep: list[Any] = []
    for _ in range(255):
        deep = [deep]
    if method == "POST":
        response = await send(api, "POST", QUEUES, body={"name": "deep", "authPolicy": deep})
    else:
        assert (await send(api, "POST", QUEUES, body={"name": "deep"})).status_code == 201
        response = await send(api, "PATCH", queue_url("deep"), body={"authPolicy": deep})
    assert_refusal(response, 422)


async def test_regression_large_free_form_floats_read_back_exactly(
    api: httpx.AsyncClient,
) -> None:
    body = {"name": "floats", "authPolicy": [1e23], "elasticity": {"kind": "fixed", "x": 1e300}}
    created = await send(api, "POST", QUEUES, body=body)
    assert created.status_code == 201, created.text
    assert (await send(api, "GET", queue_url("floats"))).json() == created.json()
