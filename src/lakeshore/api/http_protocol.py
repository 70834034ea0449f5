"""The server's HTTP/1.1 connections: uvicorn's httptools protocol with read deadlines and a
cap on open connections, so that slow or idle clients cannot hold the server.

uvicorn bounds a kept-alive connection's wait between two requests (5 s), not the reading
of a request: a connection that sent nothing, half its headers or half its body stayed
open for ever, and 1,100 of them under a 1,024 descriptor limit made every request fail,
daemons' claims included (``accept`` found no descriptor), without a line in the log.
Here, per connection:

- a request's headers must be complete within ``header_timeout_s`` of the connection's
  opening (its first request) or of the request's first byte (the next ones), and its
  body within ``body_timeout_s`` of its headers' end; a late one is answered 408 (unless
  its answer has begun) and its connection closed;
- at most ``max_connections`` connections are open. One over the cap closes the connection
  idle the longest: one with no request in flight (nothing sent yet, half its headers, or
  kept alive between requests), as nginx reuses its idle connections; so idle ones never
  crowd out a request. When every connection has a request in flight (long-poll claims
  among them), the newcomer is answered 503 with ``Retry-After`` and closed. The cap is
  sized from the process's descriptor limit (:func:`connection_cap`), which the server
  raises to its hard limit at start (:func:`raise_descriptor_limit`).

Each firing is a warning of the ``lakeshore.http`` logger naming the client's address (a
``client`` field in JSON, with ``limit``: ``header_timeout``, ``body_timeout``,
``evicted_idle`` or ``refused_full``). A flood is logged at most :data:`LINES_PER_S` lines a
second per kind; the next line that is written counts the ones left out (``suppressed``).
"""

from __future__ import annotations

import asyncio
import http
import logging
from dataclasses import dataclass, field
from typing import Any, ClassVar

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

LINES_PER_S = 10
# After an answer the server gives on its own (408, 503) it stops writing and reads, and
# discards, what the client still sends, for up to LINGER_S, before it closes: closed with
# unread bytes, a socket resets its connection, and the client may lose the answer. At
# most MAX_LINGERING connections linger at once, so a flood cannot hold descriptors.
LINGER_S = 1.0
MAX_LINGERING = 64
RESERVED_MIN = 128  # descriptors kept for the store, files, logs, a local fleet's daemons
_log = logging.getLogger("lakeshore.http")


@dataclass(frozen=True)
class Limits:
    header_timeout_s: float
    body_timeout_s: float
    max_connections: int


def connection_cap(descriptor_limit: int) -> int:
    """How many client connections ``descriptor_limit`` descriptors hold: the limit less
    an eighth of it (at least :data:`RESERVED_MIN`, at most half) for the server's own."""
    reserved = min(max(RESERVED_MIN, descriptor_limit // 8), descriptor_limit // 2)
    return max(descriptor_limit - reserved, 1)


def raise_descriptor_limit() -> int:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit where it can; the
    soft limit now in force (65,536 where there is none to read)."""
    try:
        import resource
    except ImportError:  # not on Unix
        return 1 << 16
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and (soft == resource.RLIM_INFINITY or soft < hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):  # a platform cap under the hard limit (macOS)
            pass
    return soft if soft != resource.RLIM_INFINITY else 1 << 16


@dataclass
class _Lines:
    """At most :data:`LINES_PER_S` log lines a second per kind; the rest counted."""

    window: dict[str, tuple[float, int]] = field(default_factory=dict)  # kind: (start, lines)
    suppressed: dict[str, int] = field(default_factory=dict)

    def warn(self, now: float, kind: str, client: str, message: str) -> None:
        start, lines = self.window.get(kind, (now, 0))
        if now - start >= 1.0:
            start, lines = now, 0
        if lines >= LINES_PER_S:
            self.window[kind] = (start, lines)
            self.suppressed[kind] = self.suppressed.get(kind, 0) + 1
            return
        self.window[kind] = (start, lines + 1)
        left_out = self.suppressed.pop(kind, 0)
        extra: dict[str, Any] = {"client": client, "limit": kind}
        if left_out:
            extra["suppressed"] = left_out
            message += f" ({left_out} more like it not logged)"
        _log.warning(message, extra=extra)


@dataclass
class _Shared:
    """What the connections of one server share."""

    limits: Limits
    live: set[GuardedProtocol] = field(default_factory=set)  # open, not being closed
    lingering: set[GuardedProtocol] = field(default_factory=set)
    # no request in flight, by the time they became so: the first is idle the longest
    idle: dict[GuardedProtocol, None] = field(default_factory=dict)
    lines: _Lines = field(default_factory=_Lines)


def protocol_class(limits: Limits) -> type[HttpToolsProtocol]:
    """The protocol class for one server's ``uvicorn.Config(http=...)``."""

    class ServerProtocol(GuardedProtocol):
        shared = _Shared(limits)

    return ServerProtocol


class GuardedProtocol(HttpToolsProtocol):
    shared: ClassVar[_Shared]
    _deadline: asyncio.TimerHandle | None = None
    # what a request is being read for: its headers, its body, or None (no request, or read)
    _reading: str | None = None
    _lingering = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        shared = self.shared
        shared.live.add(self)
        if len(shared.live) > shared.limits.max_connections and not self._make_room():
            return
        shared.idle[self] = None
        # the first request's headers are due from the connection's opening: one that
        # sends nothing is late too
        self._arm(shared.limits.header_timeout_s, self._headers_late)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.shared.live.discard(self)
        self.shared.idle.pop(self, None)
        self.shared.lingering.discard(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # answered and closing: read and discarded
        super().data_received(data)
        self._arm_for_reading()

    def _arm_for_reading(self) -> None:
        """The deadline of a request still partly unread after a read (most arrive whole
        in one, and cost no timer), unless the server is the one late: a request before
        it (pipelined) still has no answer, and reading waits for that."""
        if self._reading is None or self._deadline is not None or self.transport.is_closing():
            return
        ahead = self.cycle is not None and not self.cycle.response_complete
        if self.pipeline or (self._reading == "headers" and ahead):
            return  # armed when the answer ahead is complete (on_response_complete)
        if self._reading == "headers":
            self._arm(self.shared.limits.header_timeout_s, self._headers_late)
        else:
            self._arm(self.shared.limits.body_timeout_s, self._body_late)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._reading = "headers"

    def on_headers_complete(self) -> None:
        self._disarm()
        self._reading = "body" if _has_body(self.headers) else None
        self.shared.idle.pop(self, None)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        self._reading = None
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.transport.is_closing():
            return
        if self.cycle is None or self.cycle.response_complete:
            self.shared.idle.pop(self, None)
            self.shared.idle[self] = None  # idle from now: last in line to be closed
        self._arm_for_reading()  # a pipelined request's turn

    # --- the limits firing ---------------------------------------------------------------

    def _make_room(self) -> bool:
        """Close the connection idle the longest for this one; else refuse this one."""
        for oldest in self.shared.idle:
            self._warn(
                "evicted_idle",
                oldest,
                f"closed the connection from {_address(oldest)}, idle the longest, for a new "
                f"one: {self.shared.limits.max_connections} connections are open "
                "(max_connections)",
            )
            oldest._close()
            return True
        self._warn(
            "refused_full",
            self,
            f"refused a connection from {_address(self)} with 503: all "
            f"{self.shared.limits.max_connections} connections (max_connections) have a "
            "request in flight",
        )
        self._answer_and_close(
            503, "unavailable", "the server is at its connection limit; try again", retry_s=1
        )
        return False

    def _headers_late(self) -> None:
        self._deadline = None
        seconds = self.shared.limits.header_timeout_s
        self._warn(
            "header_timeout",
            self,
            f"closed a connection from {_address(self)}: a request's headers did not "
            f"arrive within {seconds:g} s (header_timeout_s)",
        )
        self._answer_and_close(
            408, "request_timeout", f"the request's headers took over {seconds:g} s"
        )

    def _body_late(self) -> None:
        self._deadline = None
        seconds = self.shared.limits.body_timeout_s
        self._warn(
            "body_timeout",
            self,
            f"closed a connection from {_address(self)}: a request's body did not arrive "
            f"within {seconds:g} s (body_timeout_s)",
        )
        cycle = self.cycle
        answered = cycle is not None and cycle.response_started
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the app reading the body is told the client left
            cycle.message_event.set()
        if answered:
            self._close()
        else:
            self._answer_and_close(
                408, "request_timeout", f"the request's body took over {seconds:g} s"
            )

    def _answer_and_close(
        self, status: int, code: str, message: str, retry_s: int | None = None
    ) -> None:
        if not self.transport.is_closing():
            body = orjson.dumps({"error": {"code": code, "message": message}})
            head = [
                f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}",
                "content-type: application/json",
                f"content-length: {len(body)}",
                "connection: close",
            ]
            if retry_s is not None:
                head.append(f"retry-after: {retry_s}")
            self.transport.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        shared = self.shared
        if (
            self.transport.is_closing()
            or len(shared.lingering) >= MAX_LINGERING
            or not self.transport.can_write_eof()
        ):
            self._close()
            return
        self._disarm()
        shared.live.discard(self)
        shared.idle.pop(self, None)
        shared.lingering.add(self)
        self._lingering = True
        self.transport.write_eof()  # the client's end of the stream closes the transport
        self._deadline = self.loop.call_later(LINGER_S, self._close)

    def _close(self) -> None:
        self._disarm()
        self.shared.live.discard(self)
        self.shared.idle.pop(self, None)
        self.shared.lingering.discard(self)
        if not self.transport.is_closing():
            self.transport.close()

    def _arm(self, delay_s: float, late: Any) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(delay_s, late)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _warn(self, kind: str, about: GuardedProtocol, message: str) -> None:
        self.shared.lines.warn(self.loop.time(), kind, _address(about), message)


def _address(protocol: HttpToolsProtocol) -> str:
    client = protocol.client
    return f"{client[0]}:{client[1]}" if client else "unknown"


def _has_body(headers: list[tuple[bytes, bytes]]) -> bool:
    for name, value in headers:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0"):
            return True
    return False
