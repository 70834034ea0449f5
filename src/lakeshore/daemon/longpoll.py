"""The daemon's claim, the one request it makes while it waits for work, over aiohttp.

An idle worker's submit→start includes the time from the server's write of a waiting
claim's answer to the daemon holding it parsed. On an idle process here httpx took
0.97 to 0.99 ms of it at p50, aiohttp 0.50 ms, and asyncio streams with the HTTP written
by hand 0.35 ms (``bench/claim_read.py``); in the whole probe of ``bench/peers.py`` the
claim over aiohttp took about 0.4 ms off the p50 on both stores. So claims go over
aiohttp, and every other request of the daemon (hello, reports, heartbeats, streamed
items) stays on httpx, whose transport the tests replace to drive a daemon against an
app in-process: a daemon given such a transport claims through it too.

:meth:`LongPoll.post` answers with a :class:`ClaimAnswer`, which the claim loop reads as it
reads an :class:`httpx.Response` (its status, body, headers, ``json()``), and fails with
an :class:`httpx.TransportError`, as the httpx client would, so the claim loop reads one
kind of answer and one kind of failure whichever way the claim went. A ``ClaimAnswer``
is not an httpx response: making an ``httpx.Request`` and an ``httpx.Response`` for each
answer cost 0.3-0.5 ms of an idle daemon's CPU (its code cold, as it is when the work
an idle worker waited for comes), on the path from the server's answer to the child. Like the httpx
client it follows no redirect, decodes a compressed answer (httpx does, from the raw
body), trusts the certificates httpx trusts (the context of :func:`tls_context`, which
the daemon's httpx client shares) and bounds the connect (DNS included) and each read.
An HTTP(S) proxy is taken from the environment once
(``HTTPS_PROXY``, ``HTTP_PROXY``, ``ALL_PROXY``, ``NO_PROXY``), as httpx reads them;
a SOCKS proxy, which aiohttp cannot use, is not. Nothing else is read from the
environment (no ``.netrc``: the token is the claim's only credential).
"""

from __future__ import annotations

import ssl
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import httpx

from lakeshore import jsontext

CONNECT_S = 10.0  # as the daemon's httpx client: connect within 10 s


class LongPoll:
    """Claims for one daemon, on one kept-alive connection, authenticated by ``token``;
    an answer may take up to ``read_s`` to come."""

    def __init__(
        self, server: str, token: str, read_s: float, tls: ssl.SSLContext | None = None
    ) -> None:
        self.server = server.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}"}
        self.timeout = aiohttp.ClientTimeout(
            total=None, connect=CONNECT_S, sock_connect=CONNECT_S, sock_read=read_s
        )
        self.proxy = proxy_for(self.server)
        self.tls = tls if tls is not None else tls_context(self.server)
        self._session: aiohttp.ClientSession | None = None

    async def post(self, path: str, body: dict[str, Any]) -> ClaimAnswer:
        url = self.server + path
        try:
            async with self._open().post(
                url, json=body, timeout=self.timeout, allow_redirects=False, proxy=self.proxy
            ) as response:
                content = await response.read()
                if "Content-Encoding" in response.headers:  # a proxy compressed it
                    content = _decoded(response.status, response.headers, content)
                return ClaimAnswer(response.status, content, response.headers)
        except (aiohttp.ClientError, TimeoutError, httpx.DecodingError) as exc:
            # a body that does not decode is lost on the way, as a cut connection is
            raise httpx.TransportError(f"{type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _open(self) -> aiohttp.ClientSession:
        """The session, made on first use (on the daemon's running loop)."""
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self.tls)
            self._session = aiohttp.ClientSession(
                connector=connector, headers=self.headers, auto_decompress=False
            )
        return self._session


@dataclass(frozen=True, slots=True, eq=False)
class ClaimAnswer:
    """A claim's answer, read as an :class:`httpx.Response` is: ``status_code``,
    ``content`` (the body, decompressed if a proxy compressed it), ``headers`` (aiohttp's,
    matched in any case), ``is_success``, ``json()`` and ``text``."""

    status_code: int
    content: bytes
    headers: Mapping[str, str]

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        return jsontext.parsed(self.content)


def _decoded(status: int, headers: Mapping[str, str], raw: bytes) -> bytes:
    """``raw`` decompressed as httpx decompresses a body (gzip, deflate, and brotli or
    zstd where their packages are installed)."""
    return httpx.Response(status, headers=list(headers.items()), content=raw).content


def tls_context(server: str) -> ssl.SSLContext:
    """The TLS context for a daemon's requests to ``server``: httpx's (its certificates,
    ``SSL_CERT_FILE`` and ``SSL_CERT_DIR`` honoured) when the server or the proxy it is
    reached through speaks TLS. Otherwise no TLS connection is ever made, and loading
    the certificates (~20 ms of CPU, at every daemon start, for each client) is skipped:
    the context then trusts no certificate, so a connection that did need one would be
    refused, never made unverified."""
    proxy = proxy_for(server.rstrip("/"))
    if urlsplit(server).scheme == "https" or (proxy and urlsplit(proxy).scheme == "https"):
        return httpx.create_ssl_context()
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies, and trusts nothing


def proxy_for(url: str) -> str | None:
    """The HTTP(S) proxy the environment names for ``url``, as httpx would take it."""
    parts = urlsplit(url)
    if urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    found = urllib.request.getproxies()
    proxy = found.get(parts.scheme) or found.get("all")
    return proxy if proxy and urlsplit(proxy).scheme in ("http", "https") else None
