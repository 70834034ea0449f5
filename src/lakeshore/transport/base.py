"""The two faces of the transport, blocking and asynchronous, as callers see them.

A caller gives a path (the server's URL and its prefix are the transport's), optional
JSON or bytes and headers, and gets an :class:`~.answer.Answer` or
:class:`~.answer.Unreachable`. Server-sent events are read with :meth:`events`. The
implementations are in :mod:`.direct` / :mod:`.direct_async` (sockets and httptools, the
fastest measured) and :mod:`.via_httpx` (proxies, and an app served in-process).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

from lakeshore import jsontext
from lakeshore.transport.answer import Answer, Event

JSON_HEADERS = {"Content-Type": "application/json"}
CONNECT_S = 10.0  # a connect (the name's lookup included) within 10 s


@dataclass(frozen=True, slots=True)
class Target:
    """A server's address, read once: ``http://`` or ``https://``, an optional prefix."""

    url: str
    https: bool
    host: str
    port: int
    host_header: str
    prefix: str

    @classmethod
    def of(cls, url: str) -> Target:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{url!r} is not an http:// or https:// address")
        https = parts.scheme == "https"
        host = parts.hostname
        port = parts.port or (443 if https else 80)  # not read out of an IPv6 host
        named = f"[{host}]" if ":" in host else host
        return cls(
            url=url.rstrip("/"),
            https=https,
            host=host,
            port=port,
            host_header=named if parts.port is None else f"{named}:{parts.port}",
            prefix=parts.path.rstrip("/"),
        )


def _prepared(
    defaults: dict[str, str],
    path: str,
    json: Any,
    body: bytes | None,
    headers: Mapping[str, str] | None,
    params: Mapping[str, Any] | None,
) -> tuple[str, bytes | None, dict[str, str]]:
    if params:
        path = f"{path}?{urlencode(params, doseq=True)}"
    merged = defaults if not headers else {**defaults, **headers}
    if json is not None:
        body = jsontext.encoded(json)  # an integer past 64 bits is written as one
        merged = {**merged, **JSON_HEADERS}
    return path, body, merged


class Transport(ABC):
    """Blocking requests to one server, safe to share between threads."""

    def __init__(self, url: str, headers: Mapping[str, str] | None) -> None:
        self.target = Target.of(url)
        self.url = self.target.url
        self.headers = dict(headers or {})

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> Answer:
        """``method path``: the answer, whatever its status;
        :class:`~.answer.Unreachable` when none came."""
        path, body, merged = _prepared(self.headers, path, json, body, headers, params)
        return self._exchange(method, path, body, merged)

    @abstractmethod
    def _exchange(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str]
    ) -> Answer: ...

    @abstractmethod
    def events(
        self, path: str, *, params: Mapping[str, Any] | None = None, read_s: float
    ) -> contextlib.AbstractContextManager[Iterator[Event]]:
        """The events of ``path`` as they come, each read within ``read_s``;
        :class:`~.answer.Refused` when the server will not open the stream."""

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class AsyncTransport(ABC):
    """Requests to one server from an event loop."""

    def __init__(self, url: str, headers: Mapping[str, str] | None, read_s: float) -> None:
        self.target = Target.of(url)
        self.url = self.target.url
        self.headers = dict(headers or {})
        self.read_s = read_s

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, Any] | None = None,
        read_s: float | None = None,
    ) -> Answer:
        """``method path``: the answer, whatever its status, read within ``read_s`` (the
        transport's own by default); :class:`~.answer.Unreachable` when none came."""
        path, body, merged = _prepared(self.headers, path, json, body, headers, params)
        return await self._exchange(method, path, body, merged, read_s or self.read_s)

    async def post(self, path: str, json: Any = None, *, read_s: float | None = None) -> Answer:
        return await self.request("POST", path, json=json, read_s=read_s)

    @abstractmethod
    async def _exchange(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str], read_s: float
    ) -> Answer: ...

    @abstractmethod
    def events(
        self, path: str, *, params: Mapping[str, Any] | None = None, read_s: float
    ) -> contextlib.AbstractAsyncContextManager[AsyncIterator[Event]]:
        """The events of ``path`` as they come, each read within ``read_s``;
        :class:`~.answer.Refused` when the server will not open the stream."""

    @abstractmethod
    async def aclose(self) -> None: ...

    async def __aenter__(self) -> AsyncTransport:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()
