"""Hypothesis properties of queue create and PATCH, on SQLite and PostgreSQL.

For bodies from a strategy that mixes nearly-valid queue specs with arbitrary JSON: never
a 5xx, every refusal in the error shape, what a 201/200 returns is what a GET reads back,
and a refusal changes nothing (neither the queue list nor the queue named).

A body is either a valid queue with zero to two fields mutated into something odd (so
that many reach the store), a spec-shaped object whose every field is random, or any
JSON value at all. With ``full=True`` (what the properties run) the strategies also
draw the inputs behind the regressions in ``test_api_fuzz_raw.py`` — lone surrogates,
reservedSlots beyond a 32-bit integer, free-form JSON nested 256 deep, free-form floats
of 2**53 or more — and a third of the valid bodies carry one of them; ``full=False``
leaves them out (handy when chasing something else).
"""

from __future__ import annotations

import functools
import json
import math
from typing import Any

import httpx
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from lakeshore.domain.kinds import ELASTICITY_KINDS, QUEUE_KINDS
from lakeshore.domain.names import NAME_RE
from tests.integration.fuzzing import QUEUES, VALID_NAME, assert_refusal, listing, queue_url, send

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
def steps_and_targets(draw: st.DrawFn, kind: str) -> dict[str, Any]:
    """``wait_target``'s required ``wait_s``, and a ``max_step`` now and then."""
    drawn: dict[str, Any] = {}
    if kind == "wait_target":
        drawn["wait_s"] = draw(st.floats(min_value=0.001, max_value=1e6))
    if kind != "fixed" and draw(st.booleans()):
        drawn["max_step"] = draw(st.integers(1, 64))
    return drawn


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
    spec.update(draw(steps_and_targets(kind)))
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
