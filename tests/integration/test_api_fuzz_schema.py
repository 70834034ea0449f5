"""Schemathesis over the published schema: no caller gets a 5xx from any operation.

Every operation of the schema the app serves (``/openapi.json``, checked to be the one
fuzzed) is driven as the admin, as a namespace's token, with no token and with a bad one,
on SQLite and PostgreSQL. Besides never a 5xx, every 4xx is in the error shape; without a
token nothing but the health check answers; a namespace's token succeeds only inside its
namespace and never on admin routes. Coverage and fuzzed cases are aimed at seeded records
(four queues, active, elastic, paused and archived, in two namespaces) so that they reach
past the 404s. The app runs in an event loop of the test's own (``fuzzing.serve``) with its
lifespan entered once per test, so the store it migrates and the requests share one loop.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.parameters import ParameterLocation
from schemathesis.generation.meta import CoveragePhaseData, TestPhase

from lakeshore.api.app import create_app
from lakeshore.config import Settings
from tests.conftest import ADMIN_TOKEN
from tests.integration.fuzzing import BASE_URL, VALID_NAME, Served, serve


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


@pytest.fixture
def served(settings: Settings) -> Iterator[Served]:
    with serve(create_app(settings)) as served:
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
    if case.operation.path not in ("/healthz", "/readyz"):
        assert response.status_code >= 400, f"{case.operation.label} answered without a token"
    return True


def only_its_own_namespace(
    ctx: Any, response: schemathesis.Response, case: schemathesis.Case
) -> bool:
    """A namespace token succeeds only inside its namespace, and never on admin routes."""
    if response.status_code >= 400 or case.operation.path in ("/healthz", "/readyz"):
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
