"""What a route that reads its own request takes, and what it leaves to the framework
(api/lean.py)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.requests import Request
from starlette.routing import Match

from lakeshore.api import lean

KNOWN = {"wait_s": lean.seconds_within(60), "answer": lean.one_of("invocations", "ids")}


@pytest.mark.parametrize(
    ("raw", "read"),
    [
        (b"", {}),
        (b"wait_s=5", {"wait_s": 5.0}),
        (b"wait_s=0.25&answer=ids", {"wait_s": 0.25, "answer": "ids"}),
        (b"wait_s=60", {"wait_s": 60.0}),
        (b"wait_s=60.5", None),  # past the most: the framework refuses it
        (b"wait_s=5e0", None),  # a number written otherwise
        (b"wait_s=", None),
        (b"wait_s=1&wait_s=2", None),  # repeated
        (b"answer=%69ds", None),  # percent-encoded
        (b"answer=rows", None),
        (b"other=1", None),  # unknown
        (b"wait_s", None),
    ],
)
def test_a_query_is_read_only_when_every_parameter_is_plain_and_known(
    raw: bytes, read: dict[str, Any] | None
) -> None:
    assert lean.query(raw, KNOWN) == read


def _request(body: bytes, headers: list[tuple[bytes, bytes]]) -> Request:
    sent = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return sent.pop(0)

    scope = {"type": "http", "method": "POST", "headers": headers, "query_string": b""}
    return Request(scope, receive)


JSON = [(b"content-type", b"application/json")]


@pytest.mark.parametrize(
    ("body", "headers", "read"),
    [
        (b'{"args": [18446744073709551617]}', JSON, {"args": [2**64 + 1]}),
        (b'{"n": 1.5}', JSON, {"n": 1.5}),
        (b"[1]", JSON, [1]),
        (b"", JSON, lean.UNREAD),
        (b"null", JSON, lean.UNREAD),
        (b'{"n": 1', JSON, lean.UNREAD),
        (b"[" + b"1" * 5000 + b"]", JSON, lean.UNREAD),  # more digits than Python converts
        (b"{}", [(b"content-type", b"application/json; charset=utf-8")], lean.UNREAD),
        (b"{}", [], lean.UNREAD),
    ],
)
async def test_a_body_is_read_as_the_framework_reads_json_or_left_to_it(
    body: bytes, headers: list[tuple[bytes, bytes]], read: Any
) -> None:
    request = _request(body, headers)
    got = await lean.json_body(request)
    assert got is read if read is lean.UNREAD else got == read
    assert await request.body() == body  # kept for the framework, should it read it


def test_a_router_answers_no_match_at_once_outside_its_literal_prefix() -> None:
    router = lean.Router(prefix="/v1/workers")
    for path in ("/v1/namespaces/default/queues/q/invocations", "/v1/worker"):
        scope = {"type": "http", "method": "POST", "path": path, "root_path": ""}
        assert router.matches(scope) == (Match.NONE, {})


async def test_a_router_inside_an_app_routes_as_any_other() -> None:
    workers = lean.Router(prefix="/v1/workers")
    others = lean.Router(prefix="/v1/namespaces/{ns}")

    @workers.post("/{worker_id}/claim")
    async def claim(worker_id: str) -> dict[str, str]:
        return {"claimed": worker_id}

    @others.post("/queues/{name}/invocations")
    async def submit(ns: str, name: str) -> dict[str, str]:
        return {"ns": ns, "queue": name}

    app = FastAPI()
    app.include_router(workers)
    app.include_router(others)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        assert (await client.post("/v1/workers/w_1/claim")).json() == {"claimed": "w_1"}
        answer = await client.post("/v1/namespaces/default/queues/q/invocations")
        assert answer.json() == {"ns": "default", "queue": "q"}
        assert (await client.get("/v1/workers/w_1/claim")).status_code == 405
        assert (await client.post("/v1/workers/w_1/other")).status_code == 404
