"""Blocking requests on kept-alive HTTP/1.1 connections to one server.

A request is written whole (its head and body in one ``sendall``) on a socket kept open
between requests, and its answer read by httptools (:mod:`.wire`). Connections are shared
between threads, and a connection the server closed while it sat idle is set aside (it
turns readable: the server's close). A connect that is refused, reset or timed out is
tried once more; a request that may have reached the server is never sent again, so a
submit is not made twice by the client.

A submit is one round trip, and the client's cost is part of it: on the 2-core bench
machine one request through the standard library's ``http.client`` costs 0.17-0.31 ms of
the client's CPU, here 0.06-0.12 ms (``bench/client_cost.py``): ``http.client`` reads an
answer's head through the ``email`` package, line by line. Streams of events go over
the httpx-backed implementation (:mod:`.via_httpx`), with the same certificates.
"""

from __future__ import annotations

import contextlib
import http.client
import select
import socket
import ssl
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from lakeshore.transport import wire
from lakeshore.transport.answer import Answer, Event, TimedOut, Unreachable
from lakeshore.transport.base import CONNECT_S, Transport
from lakeshore.transport.policy import tls_context


class _Connection:
    """One socket to the server, a request at a time."""

    __slots__ = ("host", "sock")

    def __init__(self, sock: socket.socket, host: bytes) -> None:
        self.sock: socket.socket | None = sock
        self.host = host

    def close(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()

    def exchange(
        self, method: str, target: str, body: bytes | None, headers: dict[str, str]
    ) -> tuple[Answer, bool]:
        """The answer, and whether the connection may carry another request."""
        sock = self.sock
        if sock is None:
            raise http.client.NotConnected("the connection is closed")
        sock.sendall(wire.head(method, target, self.host, headers, body) + (body or b""))
        reading = wire.Reading(head_only=method == "HEAD")
        while not reading.took(sock.recv(wire.READ_BYTES)):
            pass
        return reading.answer()


class Connections(Transport):
    """Up to ``size`` idle connections to ``url`` (``http://`` or ``https://``, with an
    optional path prefix), each request's socket operations bounded by ``timeout``."""

    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float,
        tls: ssl.SSLContext | None = None,
        size: int = 10,
    ) -> None:
        super().__init__(url, headers)
        tls = tls or tls_context(url)
        self._tls = tls if self.target.https else None
        self._tls_any = tls
        self._timeout = timeout
        self._size = size
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()
        self._closed = False
        self._streams: Transport | None = None

    def _exchange(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str]
    ) -> Answer:
        try:
            conn = self._take()
            try:
                answer, reusable = conn.exchange(method, self.target.prefix + path, body, headers)
            except BaseException:
                conn.close()
                raise
        except TimeoutError as exc:
            raise TimedOut(_reason(exc)) from None
        except (OSError, http.client.HTTPException, UnicodeError) as exc:
            raise Unreachable(_reason(exc)) from None
        if reusable:
            self._give(conn)
        else:
            conn.close()
        return answer

    @contextlib.contextmanager
    def events(
        self, path: str, *, params: Mapping[str, Any] | None = None, read_s: float
    ) -> Iterator[Iterator[Event]]:
        if self._streams is None:
            from lakeshore.transport.via_httpx import HttpxTransport

            self._streams = HttpxTransport(
                self.url, headers=self.headers, timeout=self._timeout, tls=self._tls_any
            )
        with self._streams.events(path, params=params, read_s=read_s) as events:
            yield events

    def close(self) -> None:
        """Close the idle connections, and each one in use as its request ends."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        if self._streams is not None:
            self._streams.close()

    def _take(self) -> _Connection:
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

    def _give(self, conn: _Connection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._size:
                self._idle.append(conn)
                return
        conn.close()

    def _connected(self) -> _Connection:
        target = self.target
        sock = dial(target.host, target.port, min(self._timeout, CONNECT_S))
        try:
            sock.settimeout(self._timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                sock = self._tls.wrap_socket(sock, server_hostname=target.host)
        except BaseException:
            sock.close()
            raise
        # encoded once connected: a name that cannot be encoded was refused by the dial
        return _Connection(sock, target.host_header.encode("idna"))


def dial(host: str, port: int, timeout: float) -> socket.socket:
    """A TCP connection to ``host:port`` (the name looked up), made within ``timeout``."""
    return socket.create_connection((host, port), timeout=timeout)


def _reason(exc: BaseException) -> str:
    return str(exc) if str(exc) else type(exc).__name__


def _open(conn: _Connection) -> bool:
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
