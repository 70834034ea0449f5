"""The submit routes read the request every caller sends themselves (api/lean.py) and
leave any other to the framework: both readings of the same submit agree, on both
stores, and what only the framework reads is refused in its words."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

NS = "/v1/namespaces/default"
SINGLE = f"{NS}/queues/reading/invocations"
BATCH = f"{SINGLE}/batch"
BIG = 2**64 + 1


def _kept(invocation: dict[str, Any]) -> dict[str, Any]:
    """An invocation without what differs from one submit to the next."""
    return {k: v for k, v in invocation.items() if k not in ("id", "created_at")}


# (query, content type): the first of each list is read by the route, the rest by the
# framework (a number it writes otherwise, a parameter it does not know, a charset)
SINGLE_READINGS = [
    ("", "application/json"),
    ("?wait_s=5", "application/json"),
    ("?wait_s=5e0", "application/json"),
    ("?wait_s=5&later=1", "application/json"),
    ("", "application/json; charset=utf-8"),
    ("", "application/vnd.lakeshore+json"),
]


@pytest.mark.parametrize(("query", "kind"), SINGLE_READINGS)
async def test_a_single_submit_is_the_same_however_it_is_read(
    api: httpx.AsyncClient, query: str, kind: str
) -> None:
    body = b'{"fn": "m:f", "args": [%d], "kwargs": {"n": 1}}' % BIG
    sent = await api.post(SINGLE + query, content=body, headers={"Content-Type": kind})
    assert sent.status_code == 201, sent.text
    assert _kept(sent.json())["args"] == [BIG]
    read = await api.get(f"{NS}/invocations/{sent.json()['id']}")
    assert read.json() == sent.json()


@pytest.mark.parametrize("query", ["?answer=ids", "?answer=ids&wait_s=1.5", "?answer=%69ds"])
async def test_a_batch_answered_with_ids_is_the_same_however_it_is_read(
    api: httpx.AsyncClient, query: str
) -> None:
    body = {"invocations": [{"fn": "m:f", "args": [n]} for n in range(3)]}
    sent = await api.post(BATCH + query, json=body)
    assert sent.status_code == 201, sent.text
    answer = sent.json()
    assert answer["created"] == [True, True, True]
    assert [list(i) for i in answer["invocations"]] == [["id"]] * 3


@pytest.mark.parametrize(
    ("query", "field"),
    [("?wait_s=61", "wait_s"), ("?wait_s=-1", "wait_s"), ("?answer=rows", "answer")],
)
async def test_a_query_only_the_framework_reads_is_refused_in_its_words(
    api: httpx.AsyncClient, query: str, field: str
) -> None:
    path = BATCH if field == "answer" else SINGLE
    body = {"invocations": [{"fn": "m:f"}]} if field == "answer" else {"fn": "m:f"}
    refused = await api.post(path + query, json=body)
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["field"] == field
    stats = await api.get(f"{NS}/queues/reading/stats")
    assert stats.status_code == 404 or stats.json()["pending"] == 0


async def test_a_json_null_body_is_refused_as_a_missing_body(api: httpx.AsyncClient) -> None:
    refused = await api.post(SINGLE, content=b"null", headers={"Content-Type": "application/json"})
    assert refused.status_code == 422, refused.text
