"""One HTTP transport for every client of the server: the SDK, the async client, the CLI
and the daemon.

:func:`connect` and :func:`aconnect` choose the implementation once, by the policy of
:mod:`.policy` (one reading of proxies and certificates): the direct one (:mod:`.direct`,
:mod:`.direct_async`: sockets and httptools, the fastest measured) unless a proxy is named
for the server, then the httpx-backed one (:mod:`.via_httpx`), which also serves an app
in-process for tests and reads every stream of events. Callers hold a
:class:`~.base.Transport` or an :class:`~.base.AsyncTransport` and never know which.
A refusal's body is read by :mod:`lakeshore.refusals`, the one decoder of the error
envelope.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from lakeshore.transport.answer import Answer, Event, Refused, TimedOut, Unreachable
from lakeshore.transport.base import AsyncTransport, Transport
from lakeshore.transport.policy import proxy_for, tls_context

if TYPE_CHECKING:
    import httpx

__all__ = [
    "Answer",
    "AsyncTransport",
    "Event",
    "Refused",
    "TimedOut",
    "Transport",
    "Unreachable",
    "aconnect",
    "connect",
]


def connect(
    url: str,
    *,
    headers: Mapping[str, str] | None = None,
    timeout: float = 30.0,
    size: int = 10,
    ca: str | None = None,
) -> Transport:
    """Blocking requests to ``url``, each socket operation bounded by ``timeout``, up to
    ``size`` idle connections kept; ``ca`` a certificate file or directory to trust."""
    tls = tls_context(url, ca=ca)
    proxy = proxy_for(url)
    if proxy is not None:
        from lakeshore.transport.via_httpx import HttpxTransport

        return HttpxTransport(url, headers=headers, timeout=timeout, tls=tls, proxy=proxy)
    from lakeshore.transport.direct import Connections

    return Connections(url, headers=headers, timeout=timeout, tls=tls, size=size)


def aconnect(
    url: str,
    *,
    headers: Mapping[str, str] | None = None,
    read_s: float = 30.0,
    size: int = 10,
    ca: str | None = None,
    via: httpx.AsyncBaseTransport | None = None,
) -> AsyncTransport:
    """Requests to ``url`` from an event loop, an answer read within ``read_s`` unless a
    request says otherwise; ``via`` an httpx transport that serves them instead of the
    network (an app in-process)."""
    tls = tls_context(url, ca=ca)
    proxy = proxy_for(url)
    if proxy is not None or via is not None:
        from lakeshore.transport.via_httpx import AsyncHttpxTransport

        return AsyncHttpxTransport(
            url, headers=headers, read_s=read_s, tls=tls, proxy=proxy, via=via
        )
    from lakeshore.transport.direct_async import AsyncConnections

    return AsyncConnections(url, headers=headers, read_s=read_s, tls=tls, size=size)
