"""A request that repeats ``Authorization`` or ``Content-Type`` is refused, 400 in the
API's error shape, on every route alike (a second submit door, since removed, once read
the last of two tokens where the route read the first: 201 there, 401 on the route). Raw
requests to a real server, on both stores."""

from __future__ import annotations

import json
import socket
import time
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.acceptance.conftest import LakeshoreServer

pytestmark = pytest.mark.acceptance

NS = "/v1/namespaces/default"
JUNK = "Bearer lks_not_a_token"


def exchange(
    server: LakeshoreServer, method: str, path: str, headers: list[tuple[str, str]], body: Any
) -> tuple[int, dict[str, Any]]:
    """One request written byte for byte (each header as given, repeats included) on a
    connection of its own: the answer's status and JSON body."""
    parts = urlsplit(server.url)
    data = b"" if body is None else json.dumps(body).encode()
    head = [f"{method} {path} HTTP/1.1", f"Host: {parts.netloc}", "Connection: close"]
    head += [f"{name}: {value}" for name, value in headers]
    head.append(f"Content-Length: {len(data)}")
    raw = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + data
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(raw)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    _, _, content = rest.partition(b"\r\n\r\n")
    return int(status_line.split()[1]), json.loads(content) if content else {}


@pytest.fixture
def valid(server: LakeshoreServer) -> str:
    return f"Bearer {server.admin_token}"


def listed(server: LakeshoreServer, queue: str) -> list[dict[str, Any]]:
    headers = {"Authorization": f"Bearer {server.admin_token}"}
    answer = httpx.get(f"{server.url}{NS}/queues/{queue}/invocations", headers=headers)
    assert answer.status_code == 200, answer.text
    invocations: list[dict[str, Any]] = answer.json()["invocations"]
    return invocations


def refused(status: int, answer: dict[str, Any], header: str) -> bool:
    error = answer.get("error", {})
    return (status, error.get("code"), error.get("field")) == (400, "bad_request", header)


def test_a_submit_to_a_known_queue_refuses_a_repeated_authorization_or_content_type(
    server: LakeshoreServer, valid: str
) -> None:
    """Once the queue is known, a single submit is one statement (the plain one here is
    its 201): a repeat of either header is a 400 there too, and writes nothing."""
    queue = f"doors-{time.monotonic_ns()}"
    path = f"{NS}/queues/{queue}/invocations"
    body = {"fn": "tests.udfs:noop"}
    kind = ("Content-Type", "application/json")
    for _ in range(2):  # the first reads the queue (not seen yet), the next is one statement
        status, _ = exchange(server, "POST", path, [("Authorization", valid), kind], body)
        assert status == 201
    repeats = {
        "authorization": [
            [("Authorization", JUNK), ("Authorization", valid), kind],
            [("Authorization", valid), ("Authorization", JUNK), kind],
            [("Authorization", valid), ("Authorization", valid), kind],
        ],
        "content-type": [
            [("Authorization", valid), ("Content-Type", "text/plain"), kind],
            [("Authorization", valid), kind, ("Content-Type", "text/plain")],
            [("Authorization", valid), kind, kind],
        ],
    }
    for header, cases in repeats.items():
        for headers in cases:
            status, answer = exchange(server, "POST", path, headers, body)
            assert refused(status, answer, header), (headers, status, answer)
    assert len(listed(server, queue)) == 2


def test_every_route_refuses_a_repeated_authorization_or_content_type(
    server: LakeshoreServer, valid: str
) -> None:
    """The route of a first submit (nothing created), other routes, and a public one."""
    fresh = f"fresh-{time.monotonic_ns()}"
    kind = ("Content-Type", "application/json")
    requests: list[tuple[str, str, list[tuple[str, str]], Any, str]] = [
        ("POST", f"{NS}/queues/{fresh}/invocations",
         [("Authorization", JUNK), ("Authorization", valid), kind], {"fn": "m:f"},
         "authorization"),
        ("POST", f"{NS}/queues/{fresh}/invocations/batch",
         [("Authorization", valid), ("Content-Type", "text/plain"), kind],
         {"invocations": [{"fn": "m:f"}]}, "content-type"),
        ("GET", f"{NS}/queues", [("Authorization", valid), ("Authorization", JUNK)], None,
         "authorization"),
        ("GET", "/healthz", [("Authorization", JUNK), ("Authorization", JUNK)], None,
         "authorization"),
    ]  # fmt: skip
    for method, path, headers, body, header in requests:
        status, answer = exchange(server, method, path, headers, body)
        assert refused(status, answer, header), (method, path, status, answer)
    status, _ = exchange(server, "GET", f"{NS}/queues/{fresh}", [("Authorization", valid)], None)
    assert status == 404  # the refused submits created no queue
    status, _ = exchange(server, "GET", f"{NS}/queues", [("Authorization", valid)], None)
    assert status == 200  # one of each is as before
