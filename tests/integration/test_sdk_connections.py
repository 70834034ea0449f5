"""The blocking face of the transport's direct implementation (the SDK's and the CLI's
kept-alive connections, lakeshore.transport.direct), against a loopback server that
counts the connections and requests it gets."""

from __future__ import annotations

import http.client
import select
import socket
import ssl
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from lakeshore import transport
from lakeshore.transport import direct as connections
from lakeshore.transport.direct import Connections
from tests.certificates import self_signed


class Counting(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.connections = 0
        self.requests: list[tuple[str, bytes]] = []
        self.mode = "keep"  # keep | drop-after | hang-up | close-header
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Counting

    def setup(self) -> None:
        super().setup()
        with self.server.lock:
            self.server.connections += 1

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        with self.server.lock:
            self.server.requests.append((self.path, body))
        if self.server.mode == "hang-up":  # read it, answer nothing
            self.close_connection = True
            return
        answer = b'{"ok": true}'
        self.send_response(201)
        self.send_header("Content-Length", str(len(answer)))
        if self.server.mode == "close-header":
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(answer)
        if self.server.mode == "drop-after":  # closes once idle, as a keep-alive time-out
            self.close_connection = True

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[Counting]:
    srv = Counting()
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=10)


def req(
    pool: Connections, method: str, path: str, body: bytes | None, headers: dict[str, str]
) -> tuple[int, bytes]:
    answer = pool.request(method, path, body=body, headers=headers)
    return answer.status_code, answer.content


def post(pool: Connections, path: str = "/v1/x", body: bytes = b"{}") -> tuple[int, bytes]:
    answer = pool.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    return answer.status_code, answer.content


def test_requests_share_one_kept_alive_connection(server: Counting) -> None:
    pool = Connections(server.url, timeout=10)
    try:
        answers = [post(pool, body=str(n).encode()) for n in range(5)]
    finally:
        pool.close()
    assert answers == [(201, b'{"ok": true}')] * 5
    assert server.connections == 1
    assert [body for _, body in server.requests] == [b"0", b"1", b"2", b"3", b"4"]


def test_a_path_prefix_in_the_url_is_kept(server: Counting) -> None:
    pool = Connections(server.url + "/lakeshore/", timeout=10)
    try:
        post(pool, "/v1/namespaces/default")
    finally:
        pool.close()
    assert server.requests[0][0] == "/lakeshore/v1/namespaces/default"


def test_a_connection_the_server_closed_while_idle_is_set_aside(server: Counting) -> None:
    server.mode = "drop-after"
    pool = Connections(server.url, timeout=10)
    try:
        for _ in range(3):
            assert post(pool)[0] == 201
            [idle] = pool._idle
            assert idle.sock is not None
            waiting = select.poll()  # until the server's close has arrived
            waiting.register(idle.sock, select.POLLIN)
            assert waiting.poll(10_000)
    finally:
        pool.close()
    assert len(server.requests) == 3  # each sent once, each on a connection of its own
    assert server.connections == 3


def test_an_answer_that_closes_its_connection_is_not_kept(server: Counting) -> None:
    server.mode = "close-header"
    pool = Connections(server.url, timeout=10)
    try:
        assert post(pool)[0] == 201
        assert pool._idle == []
        assert post(pool)[0] == 201
    finally:
        pool.close()
    assert server.connections == 2


def test_a_request_whose_answer_never_came_is_not_sent_again(server: Counting) -> None:
    server.mode = "hang-up"
    pool = Connections(server.url, timeout=10)
    try:
        with pytest.raises((http.client.HTTPException, OSError)):
            post(pool, body=b"once")
    finally:
        pool.close()
    assert server.requests == [("/v1/x", b"once")]


def test_a_failed_connect_is_tried_once_more(
    server: Counting, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = connections.dial
    failures = [ConnectionRefusedError("refused")]

    def dial(host: str, port: int, timeout: float) -> socket.socket:
        if failures:
            raise failures.pop()
        return real(host, port, timeout)

    monkeypatch.setattr(connections, "dial", dial)
    pool = Connections(server.url, timeout=10)
    try:
        assert post(pool)[0] == 201
    finally:
        pool.close()
    assert failures == []
    assert len(server.requests) == 1


def test_a_port_nothing_listens_on_is_refused_after_the_second_try(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    tries = []
    real = connections.dial

    def dial(host: str, port: int, timeout: float) -> socket.socket:
        tries.append(1)
        return real(host, port, timeout)

    monkeypatch.setattr(connections, "dial", dial)
    pool = Connections(f"http://127.0.0.1:{port}", timeout=10)
    with pytest.raises(transport.Unreachable, match="refused"):
        post(pool)
    assert len(tries) == 2


def test_threads_share_the_pool_up_to_its_size(server: Counting) -> None:
    pool = Connections(server.url, timeout=10, size=4)
    try:
        with ThreadPoolExecutor(8) as threads:
            answers = list(threads.map(lambda n: post(pool, body=str(n).encode()), range(80)))
        assert len(pool._idle) <= 4
    finally:
        pool.close()
    assert all(status == 201 for status, _ in answers)
    assert sorted(int(body) for _, body in server.requests) == list(range(80))
    assert server.connections <= 8


def test_an_address_that_is_not_http_is_refused() -> None:
    with pytest.raises(ValueError, match="not an http"):
        Connections("ftp://127.0.0.1:21", timeout=1)
    with pytest.raises(ValueError, match="not an http"):
        Connections("127.0.0.1:8000", timeout=1)


def test_an_ipv6_host_without_a_port_is_asked_on_the_scheme_s_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[tuple[str, int]] = []

    def dial(host: str, port: int, timeout: float) -> socket.socket:
        asked.append((host, port))
        raise ConnectionRefusedError("refused")

    monkeypatch.setattr(connections, "dial", dial)
    for url, port in (("http://[::1]", 80), ("https://[::1]", 443), ("http://[::1]:8123", 8123)):
        asked.clear()
        with pytest.raises(transport.Unreachable, match="refused"):
            post(Connections(url, timeout=1))
        assert asked == [("::1", port)] * 2


def test_a_connection_in_use_as_the_pool_closes_is_not_kept(server: Counting) -> None:
    pool = Connections(server.url, timeout=10)
    pool.close()
    assert post(pool)[0] == 201  # a request still goes out, on a connection of its own
    assert pool._idle == []


def test_the_client_says_connection_error_for_every_way_of_not_reaching_the_server(
    server: Counting,
) -> None:
    from lakeshore.sdk import Client

    server.mode = "hang-up"
    with Client(server.url, "token") as client, pytest.raises(ConnectionError, match="cannot"):
        client.request("POST", "/v1/x", json={})
    with Client("http://a..b:8000", "token") as client, pytest.raises(ConnectionError):
        client.request("GET", "/v1/x")  # a host name that cannot be looked up


@pytest.fixture
def tls_server(server: Counting, tmp_path: Path) -> Iterator[tuple[Counting, Path]]:
    cert_file, key_file = self_signed(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    yield server, cert_file


def test_https_checks_the_certificate_and_keeps_the_connection(
    tls_server: tuple[Counting, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, cert_file = tls_server
    url = f"https://127.0.0.1:{server.server_address[1]}"
    from lakeshore.sdk import Client

    connects: list[int] = []
    real = Connections._connected

    def counted(self: Connections) -> Any:
        connects.append(1)
        return real(self)

    monkeypatch.setattr(Connections, "_connected", counted)
    with Client(url, "token") as client, pytest.raises(ConnectionError, match="CERTIFICATE"):
        client.request("POST", "/v1/x", json={})  # not trusted here: refused
    assert server.requests == []
    assert len(connects) == 1  # a refused certificate is not tried again
    monkeypatch.setenv("SSL_CERT_FILE", str(cert_file))  # trusted as the system's own
    pool = Connections(url, timeout=10)
    try:
        assert [post(pool)[0] for _ in range(3)] == [201] * 3
    finally:
        pool.close()
    assert len(server.requests) == 3
    assert server.connections == 1  # one connection for all three


class Scripted:
    """A loopback server that answers each request with the next of ``answers`` (raw
    bytes; a ``CLOSE`` after them closes the connection once they are sent) and keeps
    each request's raw bytes."""

    def __init__(self, answers: list[bytes]) -> None:
        self.answers = answers
        self.requests: list[bytes] = []
        self.connections = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(10)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve)
        self.thread.start()

    def _serve(self) -> None:
        while self.answers:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                conn.settimeout(10)
                while self.answers:
                    request = self._read(conn)
                    if request is None:
                        break
                    self.requests.append(request)
                    answer = self.answers.pop(0)
                    conn.sendall(answer.removesuffix(CLOSE))
                    if answer.endswith(CLOSE):
                        break

    @staticmethod
    def _read(conn: socket.socket) -> bytes | None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return None
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
        while len(body) < length:
            body += conn.recv(65536)
        return data

    def close(self) -> None:
        self.answers.clear()
        self.listener.close()
        self.thread.join(timeout=10)


@pytest.fixture
def scripted() -> Iterator[Any]:
    made: list[Scripted] = []

    def make(answers: list[bytes]) -> Scripted:
        made.append(Scripted(answers))
        return made[-1]

    yield make
    for server in made:
        server.close()


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"
CLOSE = b"<close>"


def test_the_request_goes_out_as_one_http_1_1_message(scripted: Any) -> None:
    server = scripted([OK, OK])
    pool = Connections(server.url + "/prefix", timeout=10)
    try:
        assert req(pool, "POST", "/v1/x?a=1", b'{"n":1}', {"Authorization": "Bearer t"}) == (
            200,
            b"{}",
        )
        assert req(pool, "POST", "/v1/cancel", None, {})[0] == 200
    finally:
        pool.close()
    port = server.url.rsplit(":", 1)[1]
    assert server.requests == [
        b"POST /prefix/v1/x?a=1 HTTP/1.1\r\nHost: 127.0.0.1:"
        + port.encode()
        + b"\r\nAuthorization: Bearer t\r\nContent-Length: 7\r\n\r\n"
        + b'{"n":1}',
        b"POST /prefix/v1/cancel HTTP/1.1\r\nHost: 127.0.0.1:"
        + port.encode()
        + b"\r\nContent-Length: 0\r\n\r\n",
    ]
    assert server.connections == 1


def test_a_chunked_answer_is_read_whole_and_keeps_the_connection(scripted: Any) -> None:
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n[1,\r\n2\r\n2]\r\n0\r\n\r\n"
    )
    server = scripted([chunked, OK])
    pool = Connections(server.url, timeout=10)
    try:
        assert req(pool, "GET", "/a", None, {}) == (200, b"[1,2]")
        assert req(pool, "GET", "/b", None, {}) == (200, b"{}")
    finally:
        pool.close()
    assert server.connections == 1


def test_an_answer_ended_by_its_close_is_read_and_its_connection_not_kept(
    scripted: Any,
) -> None:
    server = scripted([b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n[1]" + CLOSE, OK])
    pool = Connections(server.url, timeout=10)
    try:
        assert req(pool, "GET", "/a", None, {}) == (200, b"[1]")
        assert pool._idle == []
        assert req(pool, "GET", "/b", None, {}) == (200, b"{}")
    finally:
        pool.close()
    assert server.connections == 2


def test_a_close_before_the_answer_s_length_is_an_error(scripted: Any) -> None:
    server = scripted([b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n[1," + CLOSE])
    pool = Connections(server.url, timeout=10)
    try:
        with pytest.raises(transport.Unreachable, match="without an answer"):
            req(pool, "POST", "/a", b"once", {})
        assert pool._idle == []
    finally:
        pool.close()
    assert len(server.requests) == 1


def test_an_answer_to_head_has_no_body(scripted: Any) -> None:
    server = scripted([b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", OK])
    pool = Connections(server.url, timeout=10)
    try:
        assert req(pool, "HEAD", "/a", None, {}) == (200, b"")
        assert req(pool, "GET", "/b", None, {}) == (200, b"{}")
    finally:
        pool.close()
    assert server.connections == 1


def test_an_answer_that_is_not_http_is_an_error_and_the_request_is_not_sent_again(
    scripted: Any,
) -> None:
    server = scripted([b"SMTP ready\r\n\r\n", OK])
    pool = Connections(server.url, timeout=10)
    try:
        with pytest.raises(transport.Unreachable, match="not HTTP"):
            req(pool, "POST", "/a", b"once", {})
        assert pool._idle == []
    finally:
        pool.close()
    assert len(server.requests) == 1


def test_bytes_after_the_answer_leave_the_connection_unused(scripted: Any) -> None:
    server = scripted([OK + OK, OK])
    pool = Connections(server.url, timeout=10)
    try:
        assert req(pool, "GET", "/a", None, {}) == (200, b"{}")
        assert req(pool, "GET", "/b", None, {}) == (200, b"{}")
    finally:
        pool.close()
    assert server.connections == 2


@pytest.mark.parametrize(
    ("path", "headers"),
    [("/a\r\nX-Injected: 1", {}), ("/a b", {}), ("/a", {"X-Token": "t\r\nX-Injected: 1"})],
)
def test_a_line_break_in_a_path_or_header_is_refused_before_anything_is_sent(
    server: Counting, path: str, headers: dict[str, str]
) -> None:
    pool = Connections(server.url, timeout=10)
    try:
        with pytest.raises(ValueError):
            req(pool, "GET", path, None, headers)
    finally:
        pool.close()
    assert server.requests == []
