"""A long-poll claim whose client hangs up, against a real ``lakeshore server``: the
server notices the hang-up while the claim waits (it watches the connection without a
task of its own), so work submitted afterwards goes to a live claim, never to the gone
one. Both stores. A claim's being in flight is read from the store (the worker's
``last_seen_at`` moves when its claim begins); every wait is bounded.
"""

from __future__ import annotations

import json
import socket
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.acceptance.conftest import clean_env, running_server
from tests.conftest import BACKENDS, _libpq

pytestmark = pytest.mark.acceptance

NS = "/v1/namespaces/default"
WAIT_S = 15.0  # the bound on any one wait


@pytest.fixture(params=BACKENDS)
def store_db(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    backend: str = request.param
    if backend == "sqlite":
        return backend, str(tmp_path / "lakeshore.db")
    fresh_pg_url: str = request.getfixturevalue("fresh_pg_url")
    return backend, fresh_pg_url


def last_seen(backend: str, db: str, worker: str) -> object:
    query = "SELECT last_seen_at FROM workers WHERE name = %s"
    if backend == "sqlite":
        with sqlite3.connect(db) as conn:
            return conn.execute(query.replace("%s", "?"), [worker]).fetchone()
    with psycopg.connect(_libpq(db)) as pg:
        return pg.execute(query, [worker]).fetchone()


def until_claiming(store_db: tuple[str, str], worker: str, seen: object) -> None:
    for _ in range(int(WAIT_S / 0.01)):  # until the server is serving the worker's claim
        if last_seen(*store_db, worker) != seen:
            return
        time.sleep(0.01)
    pytest.fail(f"the claim of {worker} never began")


def test_work_submitted_after_a_waiting_claims_hang_up_goes_to_a_live_claim(
    tmp_path: Path, store_db: tuple[str, str]
) -> None:
    """Worker A's claim waits, then its client closes the connection; worker B's claim
    then waits too, and a submit follows. Unnoticed, the hang-up would leave A's claim
    waiting the longest, and the submit would be handed to it, leased to nobody there."""
    backend, db = store_db
    env = clean_env(LAKESHORE_LOG_FORMAT="json")
    with running_server(backend, db, tmp_path / "data", tmp_path / "server.log", env) as srv:
        headers = {"Authorization": f"Bearer {srv.admin_token}"}
        with httpx.Client(base_url=srv.url, headers=headers, timeout=WAIT_S) as http:
            assert http.post(f"{NS}/queues", json={"name": "q"}).status_code == 201
            a, b = (
                http.post("/v1/workers/hello", json={"queues": ["q"]}).json()["id"]
                for _ in range(2)
            )
            seen_a, seen_b = last_seen(*store_db, a), last_seen(*store_db, b)

            body = json.dumps({"timeout_s": 20}).encode()
            port = int(srv.url.rsplit(":", 1)[1])
            with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as sock:
                head = (
                    f"POST /v1/workers/{a}/claim HTTP/1.1\r\nHost: lakeshore\r\n"
                    f"Authorization: Bearer {srv.admin_token}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                )
                sock.sendall(head.encode() + body)
                until_claiming(store_db, a, seen_a)
            # A's client is gone; B's claim waits
            answer: dict[str, Any] = {}

            def claim_b() -> None:
                with httpx.Client(base_url=srv.url, headers=headers, timeout=30) as other:
                    got = other.post(f"/v1/workers/{b}/claim", json={"timeout_s": WAIT_S})
                answer.update(status=got.status_code, body=got.json())

            thread = threading.Thread(target=claim_b, name="claim-b")
            thread.start()
            try:
                until_claiming(store_db, b, seen_b)
                submitted = http.post(f"{NS}/queues/q/invocations", json={"fn": "m:f"})
            finally:
                thread.join(30)
            assert submitted.status_code == 201, submitted.text
            read = http.get(f"{NS}/invocations/{submitted.json()['id']}").json()

    assert answer["status"] == 200, answer
    assert [i["id"] for i in answer["body"]["invocations"]] == [submitted.json()["id"]]
    assert (read["worker"], read["attempts"]) == (b, 1)
