"""The one HTTP transport (lakeshore.transport), both faces, against a server on
loopback: an answer comes back whatever its status, a failure as ``Unreachable``, which
every caller retries or reports; one proxy and certificate policy."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from lakeshore import transport
from lakeshore.transport.policy import CA_ENV, proxy_for, tls_context
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
                    (
                        int(line.split(b":", 1)[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,  # no body
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


async def claim_once(url: str, read_s: float = 10) -> transport.Answer:
    """One claim, on a transport of its own that is closed after it."""
    async with transport.aconnect(url, headers={"Authorization": "Bearer tok"}, read_s=read_s) as t:
        return await t.post("/v1/workers/w/claim", {"max": 1})


async def test_a_claim_is_posted_with_the_token_and_answered_whatever_its_status() -> None:
    answers = [http(200, {"invocations": [{"id": "inv_1"}]}), http(503, {"error": "busy"})]
    async with (
        serving(lambda _head, _body: answers.pop(0)) as (url, seen),
        transport.aconnect(url, headers={"Authorization": "Bearer tok-1"}) as t,
    ):
        first = await t.post("/v1/workers/w/claim", {"timeout_s": 5, "max": 3})
        second = await t.post("/v1/workers/w/claim", {"timeout_s": 5, "max": 3})
    assert (first.status_code, first.json()) == (200, {"invocations": [{"id": "inv_1"}]})
    assert first.header("Content-Type") == "application/json"
    assert second.status_code == 503  # a refusal is an answer: the claim loop backs off
    assert len(seen) == 2
    head, body = seen[0]
    assert head.startswith(b"POST /v1/workers/w/claim HTTP/1.1\r\n")
    assert b"\r\nAuthorization: Bearer tok-1\r\n" in head
    assert json.loads(body) == {"timeout_s": 5, "max": 3}


async def test_the_blocking_face_sends_and_reads_the_same_way() -> None:
    answers = [http(201, {"id": 2**64 + 1}), http(404, {"error": {"code": "x", "message": "y"}})]
    async with serving(lambda _head, _body: answers.pop(0)) as (url, seen):

        def both() -> list[transport.Answer]:
            with transport.connect(url + "prefix", headers={"Authorization": "Bearer s"}) as t:
                return [t.request("POST", "/a", json={"n": 2**64 + 1}), t.request("GET", "/b")]

        created, missing = await asyncio.to_thread(both)
    assert created.json() == {"id": 2**64 + 1}  # an integer past 64 bits stays one
    assert missing.status_code == 404
    assert [head.split(b" ", 2)[1] for head, _ in seen] == [b"/prefix/a", b"/prefix/b"]
    assert json.loads(seen[0][1]) == {"n": 2**64 + 1}
    assert all(b"Authorization: Bearer s\r\n" in head for head, _ in seen)


async def test_a_server_that_hangs_up_or_is_not_there_is_unreachable() -> None:
    async with serving(lambda _head, _body: None) as (url, seen):
        with pytest.raises(transport.Unreachable):
            await claim_once(url)
    assert len(seen) == 1  # sent once, never again

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(transport.Unreachable):
        await claim_once(f"http://127.0.0.1:{port}")
    with pytest.raises(transport.Unreachable):
        transport.connect(f"http://127.0.0.1:{port}").request("GET", "/")


async def test_an_answer_slower_than_the_read_bound_times_out() -> None:
    started = asyncio.Event()

    def never(_head: bytes, _body: bytes) -> bytes:
        started.set()
        return b""  # nothing written: the answer never comes

    async with serving(never) as (url, _seen):
        with pytest.raises(transport.TimedOut):
            await claim_once(url, read_s=0.2)
    assert started.is_set()


async def test_a_redirect_is_not_followed_and_a_compressed_answer_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A redirect is an answer, not a second request; a gzipped answer (a proxy that
    compresses JSON) is decoded. A ``.netrc`` naming the server is not read: the token
    is a request's only credential."""
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
    async with (
        serving(lambda _head, _body: answers.pop(0)) as (url, seen),
        transport.aconnect(url, headers={"Authorization": "Bearer tok"}) as t,
    ):
        moved = await t.post("/v1/workers/w/claim", {"max": 1})
        packed_answer = await t.post("/v1/workers/w/claim", {"max": 1})
    assert moved.status_code == 302
    assert packed_answer.json() == {"invocations": []}
    assert [head.split(b" ", 2)[1] for head, _ in seen] == [b"/v1/workers/w/claim"] * 2
    assert all(b"Authorization: Bearer tok\r\n" in head for head, _ in seen)


def _clear_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


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
def test_the_proxy_is_taken_from_the_environment(
    environment: dict[str, str], proxy: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    _clear_proxies(monkeypatch)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert proxy_for("http://lakeshore.example:8080") == proxy


async def test_every_client_goes_through_the_proxy_the_environment_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A proxy on loopback stands in for a real one: both faces send it the request in
    absolute form (the server's address in the request line), the token with it."""
    async with serving(lambda _head, _body: http(200, {"ok": True})) as (proxy_url, seen):
        _clear_proxies(monkeypatch)
        monkeypatch.setenv("HTTP_PROXY", proxy_url.rstrip("/"))
        server = "http://lakeshore.example:8080"
        async with transport.aconnect(server, headers={"Authorization": "Bearer p"}) as t:
            assert (await t.post("/v1/x", {"a": 1})).json() == {"ok": True}

        def blocking() -> transport.Answer:
            with transport.connect(server, headers={"Authorization": "Bearer p"}) as t:
                return t.request("POST", "/v1/y", json={"b": 2})

        assert (await asyncio.to_thread(blocking)).json() == {"ok": True}
    assert [head.split(b" ", 2)[1] for head, _ in seen] == [
        b"http://lakeshore.example:8080/v1/x",
        b"http://lakeshore.example:8080/v1/y",
    ]
    assert all(b"Bearer p" in head for head, _ in seen)


async def test_https_trusts_the_certificates_of_the_one_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert_file, key_file = self_signed(tmp_path)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert_file, key_file)
    _clear_proxies(monkeypatch)
    monkeypatch.delenv(CA_ENV, raising=False)
    async with serving(lambda _head, _body: http(200, {"invocations": []}), tls) as (url, seen):
        with pytest.raises(transport.Unreachable, match="CERTIFICATE_VERIFY_FAILED"):
            await claim_once(url)  # a certificate nobody said to trust
        assert seen == []
        monkeypatch.setenv("SSL_CERT_FILE", str(cert_file))  # trusted as the system's own
        response = await claim_once(url)
        monkeypatch.delenv("SSL_CERT_FILE")
        monkeypatch.setenv(CA_ENV, str(cert_file))  # Lakeshore's own setting

        def blocking() -> transport.Answer:
            with transport.connect(url) as t:
                return t.request("GET", "/x")

        again = await asyncio.to_thread(blocking)
    assert response.status_code == 200
    assert response.json() == {"invocations": []}
    assert again.status_code == 200
    assert len(seen) == 2


def test_certificates_are_loaded_only_where_tls_is_spoken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loading them is ~20 ms of a daemon's start; over plain HTTP the context trusts no
    certificate at all, so a TLS connection made by mistake would fail, not go
    unverified."""
    cert_file, _ = self_signed(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert_file))
    monkeypatch.delenv(CA_ENV, raising=False)
    _clear_proxies(monkeypatch)

    plain = tls_context("http://127.0.0.1:8000")
    assert plain.cert_store_stats()["x509_ca"] == 0
    assert plain.verify_mode == ssl.CERT_REQUIRED
    assert plain.check_hostname

    assert tls_context("https://127.0.0.1:8000").cert_store_stats()["x509_ca"] >= 1
    monkeypatch.setenv("HTTP_PROXY", "https://proxy.example:3128")  # TLS to the proxy
    assert tls_context("http://lakeshore.example:8000").cert_store_stats()["x509_ca"] >= 1


async def test_a_compressed_answer_that_does_not_decode_is_lost_on_the_way() -> None:
    """A body a proxy says it compressed but that does not decompress is lost on the
    way, as a cut connection is: the claim loop backs off and claims again."""
    broken = b"not gzip at all"
    answer = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(broken), broken)
    )
    async with serving(lambda _head, _body: answer) as (url, _seen):
        with pytest.raises(transport.Unreachable, match="DecodingError"):
            await claim_once(url)
