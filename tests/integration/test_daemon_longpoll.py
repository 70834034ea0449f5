"""The daemon's claims over aiohttp (daemon/longpoll.py), against a server on loopback:
an answer comes back as httpx's, whatever its status, and a failure as httpx's
TransportError, which the claim loop retries."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from lakeshore.daemon.longpoll import ClaimAnswer, LongPoll, proxy_for, tls_context
from tests.certificates import self_signed

Answer = Callable[[bytes, bytes], bytes | None]  # (request head, body) → what to write


@asynccontextmanager
async def serving(
    answer: Answer, tls: ssl.SSLContext | None = None
) -> AsyncIterator[tuple[str, list[tuple[bytes, bytes]]]]:
    """A server on a loopback port (over TLS with ``tls``) that answers each request with
    ``answer`` (None: it hangs up instead); the requests it read."""
    seen: list[tuple[bytes, bytes]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                body = await reader.readexactly(length)
                seen.append((head, body))
                out = answer(head, body)
                if out is None:
                    break
                writer.write(out)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=tls)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}/", seen
    finally:
        server.close()
        await server.wait_closed()


def http(status: int, payload: object) -> bytes:
    body = json.dumps(payload).encode()
    return (
        b"HTTP/1.1 %d Whatever\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
        % (status, len(body), body)
    )


async def claim_once(url: str, read_s: float = 10) -> ClaimAnswer:
    """One claim, on a LongPoll of its own that is closed after it."""
    poll = LongPoll(url, "tok", read_s=read_s)
    try:
        return await poll.post("/v1/workers/w/claim", {"max": 1})
    finally:
        await poll.aclose()


async def test_a_claim_is_posted_with_the_token_and_answered_as_httpx_would_read_it() -> None:
    answers = [http(200, {"invocations": [{"id": "inv_1"}]}), http(503, {"error": "busy"})]
    async with serving(lambda _head, _body: answers.pop(0)) as (url, seen):
        poll = LongPoll(url, "tok-1", read_s=10)
        try:
            first = await poll.post("/v1/workers/w/claim", {"timeout_s": 5, "max": 3})
            second = await poll.post("/v1/workers/w/claim", {"timeout_s": 5, "max": 3})
        finally:
            await poll.aclose()
    assert isinstance(first, ClaimAnswer)
    assert (first.status_code, first.json()) == (200, {"invocations": [{"id": "inv_1"}]})
    assert first.headers["content-type"] == "application/json"
    assert second.status_code == 503  # a refusal is an answer: the claim loop backs off
    assert len(seen) == 2
    head, body = seen[0]
    assert head.startswith(b"POST /v1/workers/w/claim HTTP/1.1\r\n")
    assert b"\r\nAuthorization: Bearer tok-1\r\n" in head
    assert json.loads(body) == {"timeout_s": 5, "max": 3}


async def test_a_server_that_hangs_up_or_is_not_there_is_a_transport_error() -> None:
    async with serving(lambda _head, _body: None) as (url, seen):
        with pytest.raises(httpx.TransportError):
            await claim_once(url)
    assert len(seen) == 1

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(httpx.TransportError):
        await claim_once(f"http://127.0.0.1:{port}")


async def test_an_answer_slower_than_the_read_time_out_is_a_transport_error() -> None:
    started = asyncio.Event()

    def never(_head: bytes, _body: bytes) -> bytes:
        started.set()
        return b""  # nothing written: the answer never comes

    async with serving(never) as (url, _seen):
        with pytest.raises(httpx.TransportError):
            await claim_once(url, read_s=0.2)
    assert started.is_set()


async def test_a_redirect_is_not_followed_and_a_compressed_answer_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the daemon's httpx client: a redirect is an answer, not a second request; a
    gzipped answer (a proxy that compresses JSON) is decoded. A ``.netrc`` naming the
    server is not read: the token is the claim's only credential."""
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login someone password secret\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    packed = gzip.compress(json.dumps({"invocations": []}).encode())
    answers = [
        b"HTTP/1.1 302 Found\r\nlocation: /elsewhere\r\ncontent-length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(packed), packed),
    ]
    async with serving(lambda _head, _body: answers.pop(0)) as (url, seen):
        poll = LongPoll(url, "tok", read_s=10)
        try:
            moved = await poll.post("/v1/workers/w/claim", {"max": 1})
            packed_answer = await poll.post("/v1/workers/w/claim", {"max": 1})
        finally:
            await poll.aclose()
    assert moved.status_code == 302
    assert packed_answer.json() == {"invocations": []}
    assert [head.split(b" ", 2)[1] for head, _ in seen] == [b"/v1/workers/w/claim"] * 2
    assert all(b"Authorization: Bearer tok\r\n" in head for head, _ in seen)


@pytest.mark.parametrize(
    ("environment", "proxy"),
    [
        ({}, None),
        ({"HTTP_PROXY": "http://proxy.example:3128"}, "http://proxy.example:3128"),
        ({"ALL_PROXY": "http://all.example:3128"}, "http://all.example:3128"),
        ({"HTTP_PROXY": "http://proxy.example:3128", "NO_PROXY": "lakeshore.example"}, None),
        ({"HTTP_PROXY": "socks5://proxy.example:1080"}, None),
    ],
)
def test_the_proxy_is_taken_from_the_environment_as_httpx_takes_it(
    environment: dict[str, str], proxy: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert proxy_for("http://lakeshore.example:8080") == proxy


async def test_a_claim_over_https_trusts_the_certificates_httpx_trusts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert_file, key_file = self_signed(tmp_path)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert_file, key_file)
    async with serving(lambda _head, _body: http(200, {"invocations": []}), tls) as (url, seen):
        with pytest.raises(httpx.TransportError, match="CERTIFICATE_VERIFY_FAILED"):
            await claim_once(url)  # a certificate nobody said to trust
        assert seen == []
        monkeypatch.setenv("SSL_CERT_FILE", str(cert_file))  # trusted as the system's own
        response = await claim_once(url)
    assert response.status_code == 200
    assert response.json() == {"invocations": []}
    assert len(seen) == 1


def test_certificates_are_loaded_only_where_tls_is_spoken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loading them is ~20 ms of a daemon's start; over plain HTTP the context trusts no
    certificate at all, so a TLS connection made by mistake would fail, not go
    unverified."""
    cert_file, _ = self_signed(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert_file))
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)

    plain = tls_context("http://127.0.0.1:8000")
    assert plain.cert_store_stats()["x509_ca"] == 0
    assert plain.verify_mode == ssl.CERT_REQUIRED
    assert plain.check_hostname

    assert tls_context("https://127.0.0.1:8000").cert_store_stats()["x509_ca"] >= 1
    monkeypatch.setenv("HTTP_PROXY", "https://proxy.example:3128")  # TLS to the proxy
    assert tls_context("http://lakeshore.example:8000").cert_store_stats()["x509_ca"] >= 1


async def test_a_compressed_answer_that_does_not_decode_is_a_transport_error() -> None:
    """A body a proxy says it compressed but that does not decompress is lost on the
    way, as a cut connection is: the claim loop backs off and claims again."""
    broken = b"not gzip at all"
    answer = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(broken), broken)
    )
    async with serving(lambda _head, _body: answer) as (url, _seen):
        with pytest.raises(httpx.TransportError, match="DecodingError"):
            await claim_once(url)
