"""Streams and payload caps over HTTP: a worker appends a generator's items, clients read
them as server-sent events ending with the final state; oversized args, results and
items are refused with 413."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from httpx_sse import aconnect_sse

from lakeshore.config import Settings
from lakeshore.services.auth import ADMIN as ADMIN_PRINCIPAL
from lakeshore.services.namespaces import DEFAULT_NAMESPACE, resolve
from lakeshore.services.taskqueue import streams as stream_service
from lakeshore.services.taskqueue.notify import Notifier
from lakeshore.store.engine import Store
from tests.integration.test_api_workers import claim, hello, submit

NS = "/v1/namespaces/default"
W = "/v1/workers"


async def running(api: httpx.AsyncClient, queue: str = "s") -> tuple[str, str]:
    """A worker holding one freshly claimed invocation: (worker id, invocation id)."""
    worker = await hello(api, [queue])
    invocation = await submit(api, queue)
    [claimed] = await claim(api, worker)
    assert claimed["id"] == invocation["id"]
    return worker, invocation["id"]


async def append(
    api: httpx.AsyncClient, worker: str, invocation: str, seq: int, items: list[Any]
) -> httpx.Response:
    return await api.post(
        f"{W}/{worker}/invocations/{invocation}/stream", json={"seq": seq, "items": items}
    )


async def events(
    api: httpx.AsyncClient, invocation: str, **params: Any
) -> list[tuple[str, str, Any]]:
    headers = params.pop("headers", {})
    url = f"{NS}/invocations/{invocation}/stream"
    async with aconnect_sse(api, "GET", url, params=params, headers=headers) as source:
        assert source.response.status_code == 200
        assert source.response.headers["content-type"].startswith("text/event-stream")
        return [(e.event, e.id, e.json()) async for e in source.aiter_sse()]


async def test_items_are_served_in_order_then_the_final_state(api: httpx.AsyncClient) -> None:
    worker, invocation = await running(api)
    assert (await append(api, worker, invocation, 0, ["a", {"b": 1}])).json() == {"next_seq": 2}
    assert (await append(api, worker, invocation, 2, [[3]])).status_code == 200
    done = await api.post(f"{W}/{worker}/invocations/{invocation}/complete", json={"result": 7})
    assert done.status_code == 200
    got = await events(api, invocation)
    assert got[:3] == [("item", "0", "a"), ("item", "1", {"b": 1}), ("item", "2", [3])]
    kind, _, final = got[3]
    assert (kind, final["state"], final["result"], len(got)) == ("end", "succeeded", 7, 4)


async def test_a_repeated_append_stores_nothing_twice(api: httpx.AsyncClient) -> None:
    worker, invocation = await running(api)
    await append(api, worker, invocation, 0, [1, 2])
    again = await append(api, worker, invocation, 1, ["changed", 3])  # a retried post
    assert again.status_code == 200
    await api.post(f"{W}/{worker}/invocations/{invocation}/complete", json={"result": None})
    items = [data for kind, _, data in await events(api, invocation) if kind == "item"]
    assert items == [1, 2, 3]


async def test_resume_after_an_item_number_or_last_event_id(api: httpx.AsyncClient) -> None:
    worker, invocation = await running(api)
    await append(api, worker, invocation, 0, list(range(5)))
    await api.post(f"{W}/{worker}/invocations/{invocation}/complete", json={"result": None})
    after = await events(api, invocation, after=2)
    assert [(e[0], e[2] if e[0] == "item" else None) for e in after] == [
        ("item", 3),
        ("item", 4),
        ("end", None),
    ]
    resumed = await events(api, invocation, headers={"Last-Event-ID": "3"})
    assert [e[0] for e in resumed] == ["item", "end"]
    assert resumed[0][1:] == ("4", 4)


async def test_a_failed_invocation_ends_its_stream_failed(api: httpx.AsyncClient) -> None:
    worker, invocation = await running(api)
    await append(api, worker, invocation, 0, ["partial"])
    error = {"type": "ValueError", "message": "midway"}
    failed = await api.post(
        f"{W}/{worker}/invocations/{invocation}/fail", json={"error": error, "retry": False}
    )
    assert failed.status_code == 200
    got = await events(api, invocation)
    assert got[0] == ("item", "0", "partial")
    assert got[-1][2]["state"] == "failed"
    assert got[-1][2]["error"]["message"] == "midway"


async def test_only_the_lease_holder_may_append(api: httpx.AsyncClient) -> None:
    worker, invocation = await running(api)
    other = await hello(api, ["s"])
    refused = await append(api, other, invocation, 0, ["x"])
    assert refused.status_code == 409
    assert "does not hold" in refused.json()["error"]["message"]
    assert (await append(api, "wkr_unknown", invocation, 0, ["x"])).status_code == 404
    await api.post(f"{W}/{worker}/invocations/{invocation}/complete", json={"result": None})
    late = await append(api, worker, invocation, 0, ["late"])
    assert late.status_code == 409
    assert [e[0] for e in await events(api, invocation)] == ["end"]


@pytest.mark.parametrize(
    "raw",
    [
        b'{"seq": -1, "items": []}',
        b'{"seq": "0", "items": []}',
        b'{"seq": true, "items": []}',
        b'{"seq": 0}',
        b'{"seq": 0, "items": "x"}',
        b'{"seq": 0, "items": [], "extra": 1}',
        b'{"seq": 0, "items": [NaN]}',
        b'{"seq": 0, "items": ["\\u0000"]}',
    ],
)
async def test_a_malformed_append_is_refused(api: httpx.AsyncClient, raw: bytes) -> None:
    worker, invocation = await running(api)
    response = await api.post(
        f"{W}/{worker}/invocations/{invocation}/stream",
        content=raw,
        headers={"content-type": "application/json"},
    )
    assert response.status_code in (400, 422), response.text
    assert response.json()["error"]["message"]


async def test_streaming_an_unknown_invocation_is_404(api: httpx.AsyncClient) -> None:
    response = await api.get(f"{NS}/invocations/inv_missing/stream")
    assert response.status_code == 404
    assert response.json()["error"]["message"] == 'invocation "inv_missing" not found'


# --- caps: 413 ----------------------------------------------------------------------------


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """Small caps, so the tests send small bodies."""
    return settings.model_copy(update={"max_payload_bytes": 1000, "max_result_bytes": 500})


async def test_oversized_args_are_refused_with_413(api: httpx.AsyncClient) -> None:
    big = {"fn": "m:f", "args": ["x" * 1000]}
    single = await api.post(f"{NS}/queues/caps/invocations", json=big)
    assert single.status_code == 413
    message = single.json()["error"]["message"]
    assert "LAKESHORE_MAX_PAYLOAD_BYTES" in message and "1,000" in message
    batch = await api.post(
        f"{NS}/queues/caps/invocations/batch",
        json={"invocations": [{"fn": "m:f"}, {"fn": "m:f", "kwargs": {"k": "y" * 1000}}]},
    )
    assert batch.status_code == 413
    assert batch.json()["error"]["field"] == "invocations[1]"
    listed = await api.get(f"{NS}/queues/caps/invocations")
    assert listed.status_code == 404 or listed.json()["invocations"] == []  # nothing stored


async def test_an_oversized_result_or_item_is_refused_and_changes_nothing(
    api: httpx.AsyncClient,
) -> None:
    worker, invocation = await running(api)
    item = await append(api, worker, invocation, 0, ["ok", "z" * 600])
    assert item.status_code == 413
    assert "item 1" in item.json()["error"]["message"]
    result = await api.post(
        f"{W}/{worker}/invocations/{invocation}/complete", json={"result": "r" * 600}
    )
    assert result.status_code == 413
    assert "LAKESHORE_MAX_RESULT_BYTES" in result.json()["error"]["message"]
    still = (await api.get(f"{NS}/invocations/{invocation}")).json()
    assert (still["state"], still["result"]) == ("running", None)
    await api.post(f"{W}/{worker}/invocations/{invocation}/complete", json={"result": "fits"})
    assert [e[0] for e in await events(api, invocation)] == ["end"]  # no item was stored


# --- following while it runs (the service, with a real store) ------------------------------


async def test_a_follower_gets_items_as_they_are_appended(
    api: httpx.AsyncClient, store: Store
) -> None:
    """Served live: each append wakes the follower, which ends when the invocation does."""
    worker, invocation = await running(api)
    notifier = Notifier()
    ns = await resolve(store, ADMIN_PRINCIPAL, DEFAULT_NAMESPACE)
    follower = stream_service.follow(store, notifier, ns, invocation, recheck_s=30)
    seen: list[Any] = []

    async def consume() -> None:
        async for event in follower:
            seen.append(event.data if event.kind == "item" else event.data["state"])

    task = asyncio.create_task(consume())
    try:
        for n in range(3):
            await stream_service.append(store, notifier, worker, invocation, n, [n], _now())
            await _until(lambda n=n: len(seen) == n + 1)
        assert seen == [0, 1, 2]
        done = await api.post(
            f"{W}/{worker}/invocations/{invocation}/complete", json={"result": None}
        )
        assert done.status_code == 200
        notifier.notify([f"stream:{invocation}"])  # the API's notifier is another object
        await asyncio.wait_for(task, timeout=10)
        assert seen == [0, 1, 2, "succeeded"]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_follower_ends_without_the_final_state_when_the_server_stops(
    api: httpx.AsyncClient, store: Store
) -> None:
    """A stream would hold a graceful stop for as long as it follows: it ends instead,
    after the items it has given, and its client resumes after the last one."""
    worker, invocation = await running(api)
    ns = await resolve(store, ADMIN_PRINCIPAL, DEFAULT_NAMESPACE)
    stopping = asyncio.Event()
    notifier = Notifier()  # the append's wakes the follower, whichever comes first
    follower = stream_service.follow(
        store, notifier, ns, invocation, recheck_s=30, stopping=stopping
    )
    seen: list[Any] = []

    async def consume() -> None:
        async for event in follower:
            seen.append((event.kind, event.data))

    task = asyncio.create_task(consume())
    try:
        await stream_service.append(store, notifier, worker, invocation, 0, ["a"], _now())
        await _until(lambda: len(seen) == 1)  # read, and now waiting for more
        assert not task.done()
        stopping.set()
        async with asyncio.timeout(10):  # bounded: its re-check is 30 s away
            await task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert seen == [("item", "a")]  # what it read before stopping, and no end


def _now() -> datetime:
    return datetime.now(UTC)


async def _until(check: Any, *, tries: int = 500) -> None:
    for _ in range(tries):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


# --- admission: a repeated key to a full queue --------------------------------------------


async def test_a_repeated_key_to_a_full_queue_returns_the_invocation(
    api: httpx.AsyncClient,
) -> None:
    queue = {"name": "full", "admission": {"max_depth": 1, "on_full": "reject"}}
    assert (await api.post(f"{NS}/queues", json=queue)).status_code == 201
    first = await api.post(f"{NS}/queues/full/invocations", json={"fn": "m:f", "key": "k"})
    assert first.status_code == 201
    again = await api.post(f"{NS}/queues/full/invocations", json={"fn": "m:f", "key": "k"})
    assert (again.status_code, again.json()["id"]) == (200, first.json()["id"])
    other = await api.post(f"{NS}/queues/full/invocations", json={"fn": "m:f", "key": "k2"})
    assert other.status_code == 429
