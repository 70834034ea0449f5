"""The HTTP surface around the routes: which paths need no token, HEAD wherever GET is
allowed, and no redirect for a trailing slash (its Location came from the Host header)."""

from __future__ import annotations

import re

import httpx
import pytest

PUBLIC = {"/healthz", "/readyz", "/openapi.json", "/docs", "/redoc"}
QUEUES = "/v1/namespaces/default/queues"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", f"{QUEUES}/"),
        ("POST", f"{QUEUES}/"),
        ("GET", "/healthz/"),
        ("GET", "/v1/namespaces/"),
    ],
)
async def test_a_trailing_slash_is_404_and_never_redirects_to_the_host_header(
    api: httpx.AsyncClient, method: str, path: str
) -> None:
    answer = await api.request(method, path, headers={"Host": "evil.example"})

    assert answer.status_code == 404
    assert "location" not in answer.headers
    assert answer.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize("path", sorted(PUBLIC))
async def test_the_schema_and_its_viewers_answer_without_a_token(
    api: httpx.AsyncClient, path: str
) -> None:
    answer = await api.get(path, headers={"Authorization": ""})

    assert answer.status_code == 200, answer.text


async def test_every_other_route_in_the_schema_needs_a_token(api: httpx.AsyncClient) -> None:
    schema = (await api.get("/openapi.json")).json()
    checked = 0
    for template, operations in schema["paths"].items():
        path = re.sub(r"\{[^}]+\}", "x", template)
        for method in operations:
            if template in PUBLIC:
                continue
            answer = await api.request(method.upper(), path, headers={"Authorization": ""})
            assert answer.status_code == 401, f"{method.upper()} {template}: {answer.text}"
            checked += 1
    assert checked > 30  # the schema was read, not an empty one


async def test_head_on_healthz_answers_the_gets_status_and_headers_without_a_body(
    api: httpx.AsyncClient,
) -> None:
    got = await api.get("/healthz")
    head = await api.head("/healthz")

    assert head.status_code == 200
    assert head.content == b""
    assert head.headers["content-type"] == got.headers["content-type"]
    assert head.headers["content-length"] == str(len(got.content))


async def test_head_on_an_authenticated_route_needs_the_token_as_the_get_does(
    api: httpx.AsyncClient,
) -> None:
    assert (await api.post(QUEUES, json={"name": "heads"})).status_code == 201
    got = await api.get(f"{QUEUES}/heads")

    head = await api.head(f"{QUEUES}/heads")
    refused = await api.head(f"{QUEUES}/heads", headers={"Authorization": ""})
    missing = await api.head(f"{QUEUES}/nothing")

    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-length"] == str(len(got.content))
    assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
    assert missing.status_code == 404 and missing.content == b""


async def test_head_where_only_post_is_allowed_is_405(api: httpx.AsyncClient) -> None:
    head = await api.head(f"{QUEUES}/heads/drain")

    assert head.status_code == 405
    assert head.content == b""


async def test_head_on_an_event_stream_ends_at_its_headers(api: httpx.AsyncClient) -> None:
    # a pending invocation's stream would wait for items; its HEAD must not
    submitted = await api.post(f"{QUEUES}/streams/invocations", json={"fn": "tests.udfs:noop"})
    assert submitted.status_code == 201, submitted.text
    stream = f"/v1/namespaces/default/invocations/{submitted.json()['id']}/stream"

    head = await api.head(stream)

    assert head.status_code == 200
    assert head.headers["content-type"].startswith("text/event-stream")
    assert head.content == b""
