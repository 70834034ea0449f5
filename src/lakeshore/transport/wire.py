"""HTTP/1.1 on the wire, for the direct implementations: a request's head written whole,
an answer read by httptools (the C parser, llhttp, that the server's uvicorn reads
requests with): chunked or sized bodies, keep-alive and ``Connection: close`` are the
parser's to know."""

from __future__ import annotations

import http.client
import zlib

import httptools

from lakeshore.transport.answer import Answer

READ_BYTES = 65_536
NO_BODY = frozenset({204, 304})
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})  # a length is sent even when empty


class Reading:
    """One answer as httptools reads it: the parser calls these methods."""

    __slots__ = (
        "body",
        "closed",
        "complete",
        "framed",
        "head_only",
        "headed",
        "headers",
        "keep",
        "messages",
        "parser",
    )

    def __init__(self, head_only: bool) -> None:
        self.body: list[bytes] = []
        self.headers: dict[str, str] = {}
        self.complete = False
        self.headed = False
        self.messages = 0
        self.framed = False  # a length or chunks: the body's end is known without a close
        self.head_only = head_only
        self.keep = False  # the answer lets the connection carry another request
        self.closed = False  # the connection closed (which may have ended the body)
        self.parser = httptools.HttpResponseParser(self)

    def on_message_begin(self) -> None:
        self.messages += 1

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.messages == 1:
            lowered = name.decode("latin-1").lower()
            if lowered in ("content-length", "transfer-encoding"):
                self.framed = True
            self.headers[lowered] = value.decode("latin-1")

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

    def took(self, data: bytes) -> bool:
        """What one read of the socket brought (nothing: the connection closed); whether
        the answer is whole now."""
        if not data:
            self.closed = self.ended()
            return True
        self.feed(data)
        return self.complete

    def answer(self) -> tuple[Answer, bool]:
        """The answer read, and whether its connection may carry another request."""
        body = b"".join(self.body)
        if "content-encoding" in self.headers:
            body = decoded(self.headers, body)
        return Answer(self.status(), body, self.headers), self.reusable(self.closed)

    def feed(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            raise http.client.HTTPException(f"the server's answer is not HTTP: {exc}") from None

    def ended(self) -> bool:
        """The connection closed: whether that ended the answer (a body with no length
        and no chunks ends with the connection); else it came without an answer."""
        status = self.parser.get_status_code() if self.headed else 0
        if self.headed and not self.framed and status not in NO_BODY:
            return True
        raise http.client.RemoteDisconnected("the server closed the connection without an answer")

    def status(self) -> int:
        return int(self.parser.get_status_code())

    def reusable(self, closed: bool) -> bool:
        return not closed and self.messages == 1 and self.keep


def head(
    method: str, target: str, host: bytes, headers: dict[str, str], body: bytes | None
) -> bytes:
    """The request's head; ``ValueError`` where a line break or a control character would
    split it (as ``http.client`` refuses it)."""
    if not target.isprintable() or " " in target:
        raise ValueError(f"the path {target!r} has a space or a control character")
    lines = [f"{method} {target} HTTP/1.1\r\n".encode("ascii"), b"Host: ", host, b"\r\n"]
    for name, value in headers.items():
        if not name.isprintable() or not value.isprintable() or ":" in name:
            raise ValueError(f"the header {name!r} has a line break or control character")
        lines.append(f"{name}: {value}\r\n".encode("latin-1"))
    if body is not None or method in _BODY_METHODS:
        lines.append(b"Content-Length: %d\r\n" % len(body or b""))
    lines.append(b"\r\n")
    return b"".join(lines)


def decoded(headers: dict[str, str], body: bytes) -> bytes:
    """The body as sent, where something on the way compressed it (gzip or deflate; no
    request asks for it); one that does not decode is lost on the way, as a cut
    connection is."""
    coding = headers.get("content-encoding", "identity").strip().lower()
    if coding in ("", "identity"):
        return body
    try:
        if coding in ("gzip", "x-gzip"):
            return zlib.decompress(body, wbits=zlib.MAX_WBITS | 16)
        if coding == "deflate":
            try:
                return zlib.decompress(body)
            except zlib.error:
                return zlib.decompress(body, wbits=-zlib.MAX_WBITS)  # deflate without zlib's head
    except zlib.error as exc:
        raise http.client.HTTPException(
            f"DecodingError: a {coding} body that does not decode: {exc}"
        ) from None
    raise http.client.HTTPException(f"DecodingError: a body in {coding!r}, which is not read here")
