"""Kept-alive HTTP/1.1 connections to one server, for the SDK's requests.

The standard library's ``http.client`` does the protocol; this keeps its connections
open between requests, shares them between threads, and sets aside a connection the
server closed while it sat idle (it turns readable: the server's close). A connect that
is refused, reset or timed out is tried once more; a request that may have reached the
server is never sent again, so a submit is not made twice by the client.

A submit is one round trip, and the client's cost is part of it: on the 2-core bench
machine one request through ``http.client`` costs 0.17-0.19 ms of the client's CPU,
through urllib3's pool 0.28-0.29 ms, through httpx 0.54-0.64 ms
(``bench/client_cost.py``).
"""

from __future__ import annotations

import http.client
import select
import ssl
import threading
from urllib.parse import urlsplit


class Connections:
    """Up to ``size`` idle connections to ``url`` (``http://`` or ``https://``, with an
    optional path prefix), each request's socket operations bounded by ``timeout``."""

    def __init__(self, url: str, *, timeout: float, size: int = 10) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{url!r} is not an http:// or https:// address")
        self.url = url
        https = parts.scheme == "https"
        self._host = parts.hostname
        # given, so that http.client does not read a port out of an IPv6 host
        self._port = parts.port or (443 if https else 80)
        self._prefix = parts.path.rstrip("/")
        self._context = ssl.create_default_context() if https else None
        self._timeout = timeout
        self._size = size
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._closed = False

    def request(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str]
    ) -> tuple[int, bytes]:
        """``method path``: the answer's status and body. ``OSError`` (a
        ``ConnectionError`` or ``TimeoutError`` among them), ``http.client.HTTPException``
        or ``UnicodeError`` (a host name that cannot be looked up) when no answer came;
        the request is not sent again."""
        conn = self._take()
        try:
            conn.request(method, self._prefix + path, body=body, headers=headers)
            response = conn.getresponse()
            data = response.read()
        except BaseException:
            conn.close()
            raise
        if response.will_close:
            conn.close()
        else:
            self._give(conn)
        return response.status, data

    def close(self) -> None:
        """Close the idle connections, and each one in use as its request ends."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _take(self) -> http.client.HTTPConnection:
        while True:
            with self._lock:
                if not self._idle:
                    break
                conn = self._idle.pop()
            if _open(conn):
                return conn
            conn.close()
        # a connect refused, reset or timed out is tried once more (nothing was sent); a
        # refused certificate or an unknown host would only fail again
        try:
            return self._connected()
        except (ConnectionError, TimeoutError):
            return self._connected()

    def _give(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._size:
                self._idle.append(conn)
                return
        conn.close()

    def _connected(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection
        if self._context is not None:
            conn = http.client.HTTPSConnection(
                self._host, self._port, timeout=self._timeout, context=self._context
            )
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
        try:
            conn.connect()
        except BaseException:
            conn.close()
            raise
        return conn


def _open(conn: http.client.HTTPConnection) -> bool:
    """Whether an idle connection is still the server's to answer on: it has a socket,
    and nothing arrived on it while it sat idle (what arrives unasked is the server's
    close, or bytes no request asked for)."""
    sock = conn.sock
    if sock is None:
        return False
    try:
        if hasattr(select, "poll"):  # not select() where it can: it fails past 1,023
            poller = select.poll()
            poller.register(sock, select.POLLIN)
            return not poller.poll(0)
        return not select.select([sock], [], [], 0)[0]  # Windows
    except (OSError, ValueError):
        return False
