"""The HTTP surface around the routes: which paths need no token, and no redirect for a
trailing slash (its Location came from the Host header)."""

from __future__ import annotations

import re

import httpx
import pytest

PUBLIC = {"/healthz", "/openapi.json", "/docs", "/redoc"}
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
