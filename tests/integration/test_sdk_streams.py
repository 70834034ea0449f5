"""Both clients' stream readers against a scripted event-stream server on loopback: a
connection that drops is made again after the last item it brought, at once when it
brought items and after a back-off when it did not, and a stream that cannot be had
after its tries raises."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import parse_qs, urlsplit

import pytest

import lakeshore
from lakeshore import Client

Connection = list[tuple[str, int | None, object]] | None  # events; None: refused outright


@contextmanager
def event_server(script: list[Connection]) -> Iterator[tuple[str, list[str]]]:
    """A server whose n-th connection sends ``script[n]``'s events, then closes
    (``None``: it answers 503); the ``after`` each asked for. Runs on its own loop."""
    asked: list[str] = []
    ready = threading.Event()
    state: dict[str, object] = {}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        target = head.split(b" ", 2)[1].decode()
        asked.append(parse_qs(urlsplit(target).query).get("after", [""])[0])
        events = script.pop(0) if script else None
        if events is None:
            body = b'{"error": {"code": "unavailable", "message": "later"}}'
            writer.write(
                b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
            )
        else:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n")
            for kind, number, data in events:
                line = f"event: {kind}\n" + (f"id: {number}\n" if number is not None else "")
                writer.write(f"{line}data: {json.dumps(data)}\n\n".encode())
        await writer.drain()
        writer.close()

    async def serve() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        state["url"] = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        state["stop"] = stop = asyncio.Event()
        state["loop"] = asyncio.get_running_loop()
        ready.set()
        async with server:
            await stop.wait()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield str(state["url"]), asked
    finally:
        loop = state["loop"]
        assert isinstance(loop, asyncio.AbstractEventLoop)
        stop = state["stop"]
        assert isinstance(stop, asyncio.Event)
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)


END = ("end", None, {"id": "inv_1", "state": "succeeded", "result": 7})


def script() -> list[Connection]:
    return [
        [("item", 0, "a"), ("item", 1, "b")],  # drops after two items
        [],  # drops having brought nothing: a back-off, then again
        None,  # refused for now
        [("item", 2, 2**64 + 1), END],
    ]


def test_the_blocking_client_resumes_a_dropped_stream_after_its_last_item() -> None:
    with event_server(script()) as (url, asked), Client(url, "t") as client:
        got = list(client.follow("inv_1"))
    assert got == [("item", "a"), ("item", "b"), ("item", 2**64 + 1), ("end", END[2])]
    assert asked == ["-1", "1", "1", "1"]


def test_the_async_client_resumes_a_dropped_stream_after_its_last_item() -> None:
    async def follow(url: str) -> list[tuple[str, object]]:
        async with lakeshore.AsyncClient(url, "t") as client:
            return [pair async for pair in client.follow("inv_1")]

    with event_server(script()) as (url, asked):
        got = asyncio.run(follow(url))
    assert got == [("item", "a"), ("item", "b"), ("item", 2**64 + 1), ("end", END[2])]
    assert asked == ["-1", "1", "1", "1"]


def test_a_stream_that_never_comes_raises_after_its_tries() -> None:
    with (
        event_server([[] for _ in range(10)]) as (url, asked),
        Client(url, "t") as client,
        pytest.raises(ConnectionError),
    ):
        list(client.follow("inv_1", reconnects=2))
    assert len(asked) == 3  # the first try and two more


def test_a_wait_for_the_end_outlasts_dropped_streams() -> None:
    dropped: list[Connection] = [[], None, [END]]
    with event_server(dropped) as (url, asked), Client(url, "t") as client:
        assert client.ended("inv_1")["result"] == 7
    assert len(asked) == 3

    async def ended(url: str) -> object:
        async with lakeshore.AsyncClient(url, "t") as client:
            return (await client.ended("inv_1"))["result"]

    with event_server([[], None, [END]]) as (url, asked):
        assert asyncio.run(ended(url)) == 7
    assert len(asked) == 3
