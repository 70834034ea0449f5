"""Slow and idle clients against a real ``lakeshore server``: read deadlines for a request's
headers and body, and a cap on open connections that closes idle ones before it refuses
anyone, never cutting a request in flight (a daemon's long-poll claim).

Deadlines and the cap are set small through the server's settings (1 s, 3 or 4
connections). A connection's end is read from its socket (the 408, then EOF; every wait
bounded), a claim's being in flight from the store (the worker's ``last_seen_at`` moves
when its claim begins). The deadlines do not touch the store: those tests run on SQLite;
the claims run on both stores.
"""

from __future__ import annotations

import json
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.acceptance.conftest import LakeshoreServer, clean_env, running_server
from tests.conftest import BACKENDS, _libpq

pytestmark = pytest.mark.acceptance

NS = "/v1/namespaces/default"
WAIT_S = 15.0  # the bound on any one wait of these tests


@pytest.fixture(params=BACKENDS)
def store_db(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    """(backend, --db value): a SQLite file path, or an empty PostgreSQL database."""
    backend: str = request.param
    if backend == "sqlite":
        return backend, str(tmp_path / "lakeshore.db")
    fresh_pg_url: str = request.getfixturevalue("fresh_pg_url")
    return backend, fresh_pg_url


@contextmanager
def server(
    tmp_path: Path, backend: str = "sqlite", db: str | None = None, **settings: str
) -> Iterator[LakeshoreServer]:
    """A server with ``settings`` (``LAKESHORE_*``) and JSON logs."""
    env = clean_env(LAKESHORE_LOG_FORMAT="json", **settings)
    db = db or str(tmp_path / "lakeshore.db")
    with running_server(backend, db, tmp_path / "data", tmp_path / "server.log", env) as srv:
        yield srv


class Sockets:
    """Raw connections to a server, each closed at the test's end."""

    def __init__(self) -> None:
        self.opened: list[socket.socket] = []

    def __call__(self, srv: LakeshoreServer) -> socket.socket:
        port = int(srv.url.rsplit(":", 1)[1])
        sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
        self.opened.append(sock)
        return sock


@pytest.fixture
def raw() -> Iterator[Sockets]:
    sockets = Sockets()
    yield sockets
    for sock in sockets.opened:
        sock.close()


def address(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"{host}:{port}"


def until_closed(sock: socket.socket) -> bytes:
    """All the server sends on ``sock`` until it closes it (each read bounded)."""
    got = b""
    for _ in range(1000):
        chunk = sock.recv(65536)
        if not chunk:
            return got
        got += chunk
    pytest.fail(f"the server did not close the connection: {got[:200]!r}")


def fired(srv: LakeshoreServer, limit: str) -> list[dict[str, Any]]:
    """The server's ``lakeshore.http`` log lines of this kind (waiting for the first)."""
    for _ in range(int(WAIT_S / 0.05)):
        lines = []
        for line in srv.log().splitlines():
            if line.startswith("{"):
                entry = json.loads(line)
                if entry.get("logger") == "lakeshore.http" and entry.get("limit") == limit:
                    lines.append(entry)
        if lines:
            return lines
        time.sleep(0.05)
    pytest.fail(f"no {limit} line in the server's log:\n{srv.log()[-3000:]}")


def bearer(srv: LakeshoreServer) -> dict[str, str]:
    return {"Authorization": f"Bearer {srv.admin_token}"}


def test_a_connection_that_sends_nothing_or_half_its_headers_is_closed_after_the_deadline(
    tmp_path: Path, raw: Sockets
) -> None:
    with server(tmp_path, LAKESHORE_HEADER_TIMEOUT_S="1") as srv:
        silent, half = raw(srv), raw(srv)
        half.sendall(b"GET /healthz HTTP/1.1\r\nHost: lakeshore\r\nAccept: */")
        # the server answers others meanwhile
        assert httpx.get(f"{srv.url}/healthz", timeout=WAIT_S).status_code == 200

        answers = [until_closed(silent), until_closed(half)]
        lines = fired(srv, "header_timeout")
        after = httpx.get(f"{srv.url}/healthz", timeout=WAIT_S)

    for answer in answers:
        assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer
        assert answer.endswith(b'{"error":{"code":"request_timeout","message":"the request\'s '
                               b'headers took over 1 s"}}'), answer  # fmt: skip
    assert after.status_code == 200
    clients = {line["client"] for line in lines}
    assert {address(silent), address(half)} <= clients, lines
    assert all("header_timeout_s" in line["message"] for line in lines)


def test_a_request_that_sends_half_its_body_is_answered_408_and_closed_after_the_deadline(
    tmp_path: Path, raw: Sockets
) -> None:
    with server(tmp_path, LAKESHORE_BODY_TIMEOUT_S="1") as srv:
        slow = raw(srv)
        head = (
            f"POST {NS}/queues/q/invocations HTTP/1.1\r\nHost: lakeshore\r\n"
            f"Authorization: Bearer {srv.admin_token}\r\nContent-Type: application/json\r\n"
            "Content-Length: 60\r\n\r\n"
        )
        slow.sendall(head.encode() + b'{"fn": "tests.udfs:echo", "args"')
        whole = httpx.post(
            f"{srv.url}{NS}/queues/q/invocations",
            json={"fn": "tests.udfs:echo", "args": [1]},
            headers=bearer(srv),
            timeout=WAIT_S,
        )

        answer = until_closed(slow)
        [line] = fired(srv, "body_timeout")
        pending = httpx.get(f"{srv.url}{NS}/queues/q/stats", headers=bearer(srv), timeout=WAIT_S)

    assert whole.status_code == 201, whole.text
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer
    assert b"the request's body took over 1 s" in answer
    assert line["client"] == address(slow)
    assert pending.json()["byState"].get("pending") == 1  # the half submit made nothing
    assert "Traceback" not in srv.log()


def test_a_pipelined_requests_half_headers_do_not_cut_the_request_before_it(
    tmp_path: Path, raw: Sockets
) -> None:
    """A claim waits 2 s with the next request's headers half sent behind it on the same
    connection (header deadline 1 s): the claim is answered first; the deadline of the
    half request runs from that answer, then 408 and the connection closed."""
    with server(tmp_path, LAKESHORE_HEADER_TIMEOUT_S="1") as srv:
        hello = httpx.post(
            f"{srv.url}/v1/workers/hello", json={"queues": ["q"]}, headers=bearer(srv)
        )
        body = b'{"timeout_s": 2}'
        claim = (
            f"POST /v1/workers/{hello.json()['id']}/claim HTTP/1.1\r\nHost: lakeshore\r\n"
            f"Authorization: Bearer {srv.admin_token}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        pipelined = raw(srv)
        pipelined.sendall(claim + b"GET /healthz HTTP/1.1\r\nHost: lakeshore\r\n")

        answers = until_closed(pipelined)
        fired(srv, "header_timeout")

    assert answers.startswith(b"HTTP/1.1 200 OK\r\n"), answers
    assert b'"invocations":[]' in answers
    assert answers.count(b"HTTP/1.1 ") == 2
    assert b"HTTP/1.1 408 Request Timeout\r\n" in answers


def _last_seen(backend: str, db: str, worker: str) -> object:
    query = "SELECT last_seen_at FROM workers WHERE name = %s"
    if backend == "sqlite":
        with sqlite3.connect(db) as conn:
            return conn.execute(query.replace("%s", "?"), [worker]).fetchone()
    with psycopg.connect(_libpq(db)) as pg:
        return pg.execute(query, [worker]).fetchone()


def claiming(
    stack: ExitStack, srv: LakeshoreServer, db: tuple[str, str], timeout_s: float
) -> tuple[str, dict[str, Any]]:
    """A new worker's claim, waiting (``timeout_s``) on a connection of its own once this
    returns: (its worker id, where its answer lands: ``status``, ``body``)."""
    with httpx.Client(base_url=srv.url, headers=bearer(srv), timeout=WAIT_S) as http:
        hello = http.post("/v1/workers/hello", json={"queues": ["q"]})
    assert hello.status_code == 200, hello.text
    worker = hello.json()["id"]
    seen = _last_seen(*db, worker)
    answer: dict[str, Any] = {}

    def claim() -> None:
        with httpx.Client(base_url=srv.url, headers=bearer(srv), timeout=30) as http:
            got = http.post(f"/v1/workers/{worker}/claim", json={"timeout_s": timeout_s})
        answer.update(status=got.status_code, body=got.json())

    thread = threading.Thread(target=claim, name=f"claim-{worker}")
    thread.start()
    stack.callback(thread.join, 30)
    for _ in range(int(WAIT_S / 0.01)):  # until the server is serving the claim
        if _last_seen(*db, worker) != seen or answer:
            break
        time.sleep(0.01)
    assert not answer, answer
    return worker, answer


def test_idle_connections_over_the_cap_neither_cut_a_waiting_claim_nor_fail_new_requests(
    tmp_path: Path, store_db: tuple[str, str], raw: Sockets
) -> None:
    """With room for 4 connections, a daemon's claim waits while 12 connections open and
    send nothing: each new one closes the one idle the longest, never the claim; a submit
    and a second daemon's claim then get through, and the waiting claim gets the work."""
    backend, db = store_db
    with (
        server(tmp_path, backend, db, LAKESHORE_MAX_CONNECTIONS="4") as srv,
        ExitStack() as stack,
    ):
        _, waiting = claiming(stack, srv, store_db, timeout_s=15)
        idle = [raw(srv) for _ in range(12)]
        submitted = httpx.post(
            f"{srv.url}{NS}/queues/q/invocations",
            json={"fn": "tests.udfs:echo", "args": [7]},
            headers=bearer(srv),
            timeout=WAIT_S,
        )
        with httpx.Client(base_url=srv.url, headers=bearer(srv), timeout=WAIT_S) as http:
            other = http.post("/v1/workers/hello", json={"queues": ["q"]}).json()["id"]
            second = http.post(f"/v1/workers/{other}/claim", json={"timeout_s": 0})
        stack.close()  # the waiting claim answered
        closed = []
        for sock in idle:
            sock.settimeout(0.2)
            with suppress(TimeoutError):
                closed += [sock] if sock.recv(1) == b"" else []
        evicted = {line["client"] for line in fired(srv, "evicted_idle")}

    assert submitted.status_code == 201, submitted.text
    assert second.status_code == 200, second.text
    assert waiting["status"] == 200, waiting
    assert [i["id"] for i in waiting["body"]["invocations"]] == [submitted.json()["id"]]
    assert len(closed) >= 12 - 3  # at most 3 left beside the claim
    assert {address(sock) for sock in closed} & evicted  # logged (10 lines a second at most)


def test_when_every_connection_has_a_request_in_flight_a_new_one_gets_503(
    tmp_path: Path, store_db: tuple[str, str], raw: Sockets
) -> None:
    """With room for 3 connections, all 3 holding waiting claims: a 4th connection is
    answered 503 with Retry-After and closed, and the claims are all answered."""
    backend, db = store_db
    with server(tmp_path, backend, db, LAKESHORE_MAX_CONNECTIONS="3") as srv:
        with ExitStack() as stack:
            answers = [claiming(stack, srv, store_db, timeout_s=2)[1] for _ in range(3)]
            refused = raw(srv)
            refused.sendall(b"GET /healthz HTTP/1.1\r\nHost: lakeshore\r\n\r\n")
            answer = until_closed(refused)
        [line] = fired(srv, "refused_full")

    assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), answer
    assert b"\r\nretry-after: 1\r\n" in answer
    assert line["client"] == address(refused)
    assert [a["status"] for a in answers] == [200, 200, 200], answers
