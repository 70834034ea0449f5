"""`lakeshore queues events NAME --follow` against a real server: a burst of more events
than a page between two polls is printed in full, in order, as JSON lines with --json."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

import httpx
import pytest

from tests.acceptance.conftest import LAKESHORE, WIDE, Cli, LakeshoreServer, clean_env

NS = "/v1/namespaces/default"
READ_TIMEOUT_S = 30.0
BURST = 7  # ticks between two polls; the CLI's page is 2 events


@pytest.fixture
def http(server: LakeshoreServer) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {server.admin_token}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=30.0) as client:
        yield client


class Lines:
    """A child's stdout read on a thread, so each read can give up at a deadline."""

    def __init__(self, stream: IO[str]) -> None:
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._thread.start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            self._lines.put(line)
        self._lines.put(None)

    def join(self) -> None:
        self._thread.join(timeout=10)

    def next(self, deadline: float) -> str:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError("no line from the CLI before the deadline")
        try:
            line = self._lines.get(timeout=left)
        except queue.Empty:
            raise AssertionError("no line from the CLI before the deadline") from None
        if line is None:
            raise AssertionError("the CLI ended its output")
        return line


@contextmanager
def following(cli: Cli, *args: str) -> Iterator[Lines]:
    """``lakeshore *args`` running in the background; Ctrl-C (SIGINT) at the end, which
    must stop it cleanly."""
    env = clean_env(
        LAKESHORE_URL=cli.url,
        LAKESHORE_DATA_DIR=str(cli.scratch),
        LAKESHORE_TOKEN=cli.admin_token,
        COLUMNS=WIDE,
    )
    process = subprocess.Popen(
        [str(LAKESHORE), *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert process.stdout is not None and process.stderr is not None
    lines = Lines(process.stdout)
    try:
        yield lines
    finally:
        process.send_signal(signal.SIGINT)
        try:
            code = process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
            raise
        finally:
            lines.join()
            stderr = process.stderr.read()
            process.stdout.close()
            process.stderr.close()
        assert code == 0, stderr
        assert "Traceback" not in stderr


def tick(http: httpx.Client) -> None:
    response = http.post("/v1/admin/elasticity/tick")
    assert response.status_code == 200, response.text


def events_after(http: httpx.Client, name: str, last: int) -> list[dict[str, Any]]:
    params: dict[str, Any] = {"verbose": True, "since": last, "limit": 500}
    page = http.get(f"{NS}/queues/{name}/events", params=params).json()
    assert page["next_cursor"] is None
    return list(reversed(page["events"]))


def test_follow_prints_every_event_of_a_burst_larger_than_a_page_as_json_lines(
    cli: Cli, http: httpx.Client
) -> None:
    name = "followed"
    body = {"name": name, "elasticity": {"kind": "fully_elastic", "min": 0, "max": 1}}
    assert http.post(f"{NS}/queues", json=body).status_code == 201
    tick(http)  # no provider: a no-op, the one event there is
    deadline = time.monotonic() + READ_TIMEOUT_S
    args = ["queues", "events", name, "--follow", "--verbose", "--json", "--limit", "2"]
    with following(cli, *args) as lines:
        first = json.loads(lines.next(deadline))
        assert (first["scope"], first["action"]) == (name, "tick_noop")
        for n in range(BURST):  # all between two polls (the CLI polls every 2 s)
            # one more pending invocation per tick: each no-op reads new signals, so each
            # is a row of its own (identical consecutive no-ops fold into one)
            submitted = http.post(f"{NS}/queues/{name}/invocations", json={"fn": f"m:f{n}"})
            assert submitted.status_code == 201, submitted.text
            tick(http)
        # the server's own controller may tick meanwhile too; every event counts
        wanted = [e["id"] for e in events_after(http, name, first["id"])]
        assert len(wanted) >= BURST
        seen: list[dict[str, Any]] = []
        while len(seen) < len(wanted):
            seen.append(json.loads(lines.next(deadline)))
    assert [e["id"] for e in seen] == wanted
    assert {(e["scope"], e["action"]) for e in seen} == {(name, "tick_noop")}
    assert all(set(e) >= {"id", "reason", "before", "createdAt"} for e in seen)


def test_follow_without_json_prints_readable_lines(cli: Cli, http: httpx.Client) -> None:
    name = "plain"
    body = {"name": name, "elasticity": {"kind": "fully_elastic", "min": 0, "max": 1}}
    assert http.post(f"{NS}/queues", json=body).status_code == 201
    deadline = time.monotonic() + READ_TIMEOUT_S
    with following(cli, "queues", "events", name, "--follow", "--verbose", "--limit", "1") as out:
        for _ in range(3):
            tick(http)
        line = out.next(deadline)
        assert f" · {name} · tick_noop · " in line
