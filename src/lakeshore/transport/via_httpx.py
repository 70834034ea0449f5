"""The httpx-backed implementation: requests through a proxy, an app served in-process
(a test's ``httpx.ASGITransport``), and every stream of server-sent events (httpx-sse)."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import httpx
from httpx_sse import SSEError, aconnect_sse, connect_sse

from lakeshore.transport.answer import Answer, Event, Refused, TimedOut, Unreachable
from lakeshore.transport.base import CONNECT_S, AsyncTransport, Transport


def _answer(response: httpx.Response) -> Answer:
    return Answer(response.status_code, response.content, _lowered(response.headers))


def _lowered(headers: httpx.Headers) -> dict[str, str]:
    return {name.lower(): value for name, value in headers.items()}


def _failure(exc: Exception) -> Unreachable:
    """An httpx failure as the transport's: the message names the failure's kind only
    (a protocol error's message can quote headers, the token among them)."""
    detail = str(exc) if isinstance(exc, (httpx.ConnectError, httpx.TimeoutException)) else ""
    reason = f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
    if isinstance(exc, httpx.TimeoutException):
        return TimedOut(reason)
    return Unreachable(reason)


_FAILURES = (httpx.TransportError, httpx.DecodingError, httpx.InvalidURL, SSEError)


class HttpxTransport(Transport):
    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float,
        tls: ssl.SSLContext,
        proxy: str | None = None,
        via: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(url, headers)
        self.timeout = timeout
        self._client = httpx.Client(
            base_url=self.url,
            timeout=httpx.Timeout(timeout, connect=min(timeout, CONNECT_S)),
            verify=tls,
            proxy=proxy,
            transport=via,
            trust_env=False,  # the environment was read once, by .policy
        )

    def _exchange(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str]
    ) -> Answer:
        try:
            return _answer(self._client.request(method, path, content=body, headers=headers))
        except _FAILURES as exc:
            raise _failure(exc) from exc

    @contextlib.contextmanager
    def events(
        self, path: str, *, params: Mapping[str, Any] | None = None, read_s: float
    ) -> Iterator[Iterator[Event]]:
        timeout = httpx.Timeout(self.timeout, read=read_s)
        try:
            with connect_sse(
                self._client, "GET", path, params=params, headers=self.headers, timeout=timeout
            ) as source:
                if not source.response.is_success:
                    source.response.read()
                    raise Refused(_answer(source.response))
                yield (Event(e.event, e.id, e.data) for e in source.iter_sse())
        except _FAILURES as exc:
            raise _failure(exc) from exc

    def close(self) -> None:
        self._client.close()


class AsyncHttpxTransport(AsyncTransport):
    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        read_s: float,
        tls: ssl.SSLContext,
        proxy: str | None = None,
        via: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(url, headers, read_s)
        self._client = httpx.AsyncClient(
            base_url=self.url,
            timeout=httpx.Timeout(CONNECT_S, read=read_s),
            verify=tls,
            proxy=proxy,
            transport=via,
            trust_env=False,  # the environment was read once, by .policy
        )

    async def _exchange(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str], read_s: float
    ) -> Answer:
        timeout = httpx.Timeout(CONNECT_S, read=read_s)
        try:
            response = await self._client.request(
                method, path, content=body, headers=headers, timeout=timeout
            )
        except _FAILURES as exc:
            raise _failure(exc) from exc
        return _answer(response)

    @contextlib.asynccontextmanager
    async def events(
        self, path: str, *, params: Mapping[str, Any] | None = None, read_s: float
    ) -> AsyncIterator[AsyncIterator[Event]]:
        timeout = httpx.Timeout(CONNECT_S, read=read_s)
        try:
            async with aconnect_sse(
                self._client, "GET", path, params=params, headers=self.headers, timeout=timeout
            ) as source:
                if not source.response.is_success:
                    await source.response.aread()
                    raise Refused(_answer(source.response))
                yield (Event(e.event, e.id, e.data) async for e in source.aiter_sse())
        except _FAILURES as exc:
            raise _failure(exc) from exc

    async def aclose(self) -> None:
        await self._client.aclose()
