"""Kept-alive HTTP/1.1 connections to one server, for the SDK's requests.

A request is written whole (its head and body in one ``sendall``) on a socket kept open
between requests, and its answer is read by httptools (the C parser, llhttp, that the
server's uvicorn reads requests with): chunked or sized bodies, keep-alive and the
server's ``Connection: close`` are the parser's to know. Connections are shared between
threads, and a connection the server closed while it sat idle is set aside (it turns
readable: the server's close). A connect that is refused, reset or timed out is tried once
more; a request that may have reached the server is never sent again, so a submit is not
made twice by the client.

A submit is one round trip, and the client's cost is part of it: on the 2-core bench
machine one request through the standard library's ``http.client`` (this module's
transport before) costs 0.17-0.31 ms of the client's CPU, here 0.06-0.12 ms
(``bench/client_cost.py``): ``http.client`` reads an answer's head through the ``email``
package, line by line.
"""

from __future__ import annotations

import http.client
import select
import socket
import ssl
import threading
from urllib.parse import urlsplit

import httptools

_READ_BYTES = 65_536
_NO_BODY = frozenset({204, 304})
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})  # a length is sent even when empty


class _Answer:
    """One answer as httptools reads it: the parser calls these methods."""

    __slots__ = ("body", "complete", "framed", "head_only", "headed", "keep", "messages", "parser")

    def __init__(self, head_only: bool) -> None:
        self.body: list[bytes] = []
        self.complete = False
        self.headed = False
        self.messages = 0
        self.framed = False  # a length or chunks: the body's end is known without a close
        self.head_only = head_only
        self.keep = False  # the answer lets the connection carry another request
        self.parser = httptools.HttpResponseParser(self)

    def on_message_begin(self) -> None:
        self.messages += 1

    def on_header(self, name: bytes, _value: bytes) -> None:
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self.framed = True

    def on_headers_complete(self) -> None:
        self.headed = True
        self.keep = self.parser.should_keep_alive()  # known while the head is read
        if self.head_only:  # an answer to HEAD has a length but no body
            self.complete = True

    def on_body(self, data: bytes) -> None:
        if self.messages == 1:  # not a second answer no request asked for
            self.body.append(data)

    def on_message_complete(self) -> None:
        self.complete = True


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
    ) -> tuple[int, bytes, bool]:
        """The answer's status and body, and whether the connection may carry another
        request."""
        sock = self.sock
        if sock is None:
            raise http.client.NotConnected("the connection is closed")
        sock.sendall(_head(method, target, self.host, headers, body) + (body or b""))
        answer = _Answer(head_only=method == "HEAD")
        parser = answer.parser
        reusable = True
        try:
            while not answer.complete:
                data = sock.recv(_READ_BYTES)
                if not data:
                    status = parser.get_status_code() if answer.headed else 0
                    if answer.headed and not answer.framed and status not in _NO_BODY:
                        # no length and no chunks: the body ended with the connection
                        reusable = False
                        break
                    raise http.client.RemoteDisconnected(
                        "the server closed the connection without an answer"
                    )
                parser.feed_data(data)
        except httptools.HttpParserError as exc:
            raise http.client.HTTPException(f"the server's answer is not HTTP: {exc}") from None
        reusable = reusable and answer.messages == 1 and answer.keep
        return parser.get_status_code(), b"".join(answer.body), reusable


def _head(
    method: str, target: str, host: bytes, headers: dict[str, str], body: bytes | None
) -> bytes:
    """The request's head, refused as ``http.client`` refuses it when a line break or a
    control character would split it."""
    if not target.isprintable() or " " in target:
        raise http.client.InvalidURL(f"the path {target!r} has a space or a control character")
    lines = [f"{method} {target} HTTP/1.1\r\n".encode("ascii"), b"Host: ", host, b"\r\n"]
    for name, value in headers.items():
        if not name.isprintable() or not value.isprintable() or ":" in name:
            raise ValueError(f"the header {name!r} has a line break or control character")
        lines.append(f"{name}: {value}\r\n".encode("latin-1"))
    if body is not None or method in _BODY_METHODS:
        lines.append(b"Content-Length: %d\r\n" % len(body or b""))
    lines.append(b"\r\n")
    return b"".join(lines)


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
        # given, so that the port is not read out of an IPv6 host
        self._port = parts.port or (443 if https else 80)
        named = f"[{self._host}]" if ":" in self._host else self._host
        self._host_header = named if parts.port is None else f"{named}:{parts.port}"
        self._prefix = parts.path.rstrip("/")
        self._context = ssl.create_default_context() if https else None
        self._timeout = timeout
        self._size = size
        self._idle: list[_Connection] = []
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
            status, data, reusable = conn.exchange(method, self._prefix + path, body, headers)
        except BaseException:
            conn.close()
            raise
        if reusable:
            self._give(conn)
        else:
            conn.close()
        return status, data

    def close(self) -> None:
        """Close the idle connections, and each one in use as its request ends."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

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
        sock = dial(self._host, self._port, self._timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._context is not None:
                sock = self._context.wrap_socket(sock, server_hostname=self._host)
        except BaseException:
            sock.close()
            raise
        # encoded once connected: a name that cannot be encoded was refused by the dial
        return _Connection(sock, self._host_header.encode("idna"))


def dial(host: str, port: int, timeout: float) -> socket.socket:
    """A TCP connection to ``host:port``, its operations bounded by ``timeout``."""
    return socket.create_connection((host, port), timeout=timeout)


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
