"""Raw-bytes edge cases of the HTTP API, and regressions of what fuzzing once found.

On SQLite and PostgreSQL, whatever bytes arrive the answer is never a 5xx, and a refusal
is in the error shape: malformed JSON, NaN and infinities, deep nesting, oversized and
chunked bodies, a bad Content-Length, the wrong content type, unknown routes and methods,
bad query values, empty and null bodies.

What fuzzing once found (out-of-range counts, lone surrogates, deep nesting, floats that
PostgreSQL's jsonb rewrote) has a minimal reproduction at the end as a regression test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.integration.fuzzing import QUEUES, assert_refusal, json_bytes, queue_url, send

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


async def over_the_cap(head: bytes, tail: bytes) -> AsyncIterator[bytes]:
    """A body of 1.2 MB sent in chunks, with no declared length: ``head``, 1.2 MB of
    ``x``, ``tail``."""
    yield head
    for _ in range(12):
        yield b"x" * 100_000
    yield tail


async def test_a_chunked_body_over_1_mib_is_413(api: httpx.AsyncClient) -> None:
    chunks = over_the_cap(b'{"name": "big", "description": "', b'"}')
    response = await send(api, "POST", QUEUES, content=chunks, headers=JSON)
    assert "content-length" not in response.request.headers
    assert assert_refusal(response, 413)["code"] == "payload_too_large"
    assert (await send(api, "GET", queue_url("big"))).status_code == 404


async def test_a_chunked_submit_over_1_mib_is_413_also_to_a_known_queue(
    api: httpx.AsyncClient,
) -> None:
    """A single submit to a queue the server knows is one statement: an oversized body
    of undeclared length is still a 413."""
    submits = f"{QUEUES}/known/invocations"
    for _ in range(2):
        first = await send(api, "POST", submits, content=json_bytes({"fn": "m:f"}), headers=JSON)
        assert first.status_code == 201, first.text

    chunks = over_the_cap(b'{"fn": "m:f", "args": ["', b'"]}')
    response = await send(api, "POST", submits, content=chunks, headers=JSON)
    assert assert_refusal(response, 413)["code"] == "payload_too_large"
    stats = await send(api, "GET", f"{QUEUES}/known/stats")
    assert stats.json()["pending"] == 2


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
    body = {"name": "floats", "elasticity": {"kind": "fixed", "x": 1e300, "y": [1e23]}}
    created = await send(api, "POST", QUEUES, body=body)
    assert created.status_code == 201, created.text
    assert (await send(api, "GET", queue_url("floats"))).json() == created.json()
