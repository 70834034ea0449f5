"""Requests from an event loop on kept-alive HTTP/1.1 connections: asyncio streams, the
head written whole, the answer read by httptools (:mod:`.wire`).

This is the daemon's path for every request (its claims above all: an idle worker's
submit→start includes the time from the server's write of a waiting claim's answer to the
daemon holding it parsed). On an idle process here httpx took 0.97 to 0.99 ms of that at
p50, aiohttp 0.50 ms, and asyncio streams with the HTTP written by hand 0.35 ms
(``bench/claim_read.py``). Streams of events go over the httpx-backed implementation
(:mod:`.via_httpx`), with the same certificates.

A connect that is refused, reset or timed out is tried once more; a request that may have
reached the server is never sent again. A connection the server closed while it sat idle
is set aside when it is next taken.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import ssl
from collections.abc import AsyncIterator, Mapping
from typing import Any

from lakeshore.transport import wire
from lakeshore.transport.answer import Answer, Event, TimedOut, Unreachable
from lakeshore.transport.base import CONNECT_S, AsyncTransport
from lakeshore.transport.policy import tls_context


class _Connection:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def open(self) -> bool:
        return not (self.reader.at_eof() or self.writer.is_closing())

    def close(self) -> None:
        self.writer.close()


class AsyncConnections(AsyncTransport):
    """Up to ``size`` idle connections to ``url``; an answer is read within ``read_s``
    unless a request says otherwise."""

    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        read_s: float,
        tls: ssl.SSLContext | None = None,
        size: int = 10,
    ) -> None:
        super().__init__(url, headers, read_s)
        tls = tls or tls_context(url)
        self._tls = tls if self.target.https else None
        self._tls_any = tls
        self._host = self.target.host_header.encode("idna")
        self._size = size
        self._idle: list[_Connection] = []
        self._closed = False
        self._streams: AsyncTransport | None = None

    async def _exchange(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str], read_s: float
    ) -> Answer:
        try:
            conn = await self._take()
            try:
                answer, reusable = await self._once(conn, method, path, body, headers, read_s)
            except BaseException:
                conn.close()
                raise
        except TimeoutError as exc:
            raise TimedOut(_reason(exc)) from None
        except (OSError, http.client.HTTPException, UnicodeError) as exc:
            raise Unreachable(_reason(exc)) from None
        if reusable and not self._closed and len(self._idle) < self._size:
            self._idle.append(conn)
        else:
            conn.close()
        return answer

    async def _once(
        self,
        conn: _Connection,
        method: str,
        path: str,
        body: bytes | None,
        headers: dict[str, str],
        read_s: float,
    ) -> tuple[Answer, bool]:
        target = self.target.prefix + path
        conn.writer.write(wire.head(method, target, self._host, headers, body) + (body or b""))
        reading = wire.Reading(head_only=method == "HEAD")
        async with asyncio.timeout(read_s):
            await conn.writer.drain()
            while not reading.took(await conn.reader.read(wire.READ_BYTES)):
                pass
        return reading.answer()

    async def _take(self) -> _Connection:
        while self._idle:
            conn = self._idle.pop()
            if conn.open():
                return conn
            conn.close()
        try:
            return await self._connected()
        except (ConnectionError, TimeoutError):  # nothing was sent: once more
            return await self._connected()

    async def _connected(self) -> _Connection:
        target = self.target
        async with asyncio.timeout(CONNECT_S):
            reader, writer = await asyncio.open_connection(
                target.host,
                target.port,
                ssl=self._tls,
                server_hostname=target.host if self._tls is not None else None,
            )
        return _Connection(reader, writer)

    @contextlib.asynccontextmanager
    async def events(
        self, path: str, *, params: Mapping[str, Any] | None = None, read_s: float
    ) -> AsyncIterator[AsyncIterator[Event]]:
        if self._streams is None:
            from lakeshore.transport.via_httpx import AsyncHttpxTransport

            self._streams = AsyncHttpxTransport(
                self.url, headers=self.headers, read_s=self.read_s, tls=self._tls_any
            )
        async with self._streams.events(path, params=params, read_s=read_s) as events:
            yield events

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        if self._streams is not None:
            await self._streams.aclose()


def _reason(exc: BaseException) -> str:
    return str(exc) if str(exc) else type(exc).__name__
