"""A daemon's sentinel, a real process, against a loopback server that records what it
is sent: what it reports when its daemon is gone, and that it reports nothing when the
daemon leaves on its own. (Its daemon killed with SIGKILL: tests/acceptance/
test_crash_costs.py.)"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from lakeshore.daemon.sentinel import Sentinel

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the sentinel runs on Linux"
)


class Recorder(ThreadingHTTPServer):
    def __init__(self, statuses: list[int]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.statuses = statuses  # answered in turn, then 200
        self.seen: list[tuple[str, str, Any]] = []  # path, authorization, body

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: Recorder

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.seen.append((self.path, self.headers["Authorization"], body))
        status = self.server.statuses.pop(0) if self.server.statuses else 200
        answer = b'{"retried": 0, "failed": 0, "released": 0, "gone": true}'
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    server = Recorder([])
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


def started(recorder: Recorder) -> Sentinel:
    sentinel = Sentinel()
    sentinel.start()
    sentinel.serve(server=recorder.url, token="tok", worker="w-1", session="s-1", lease_s=30)
    return sentinel


def test_a_dead_daemon_s_sentinel_reports_what_began_and_had_not_ended(
    recorder: Recorder,
) -> None:
    sentinel = started(recorder)
    for invocation in ("a", "b"):
        sentinel.begin(invocation)
    sentinel.end("a")  # told with the next begin
    sentinel.begin("c")
    sentinel.end("c")  # never told: charged, as it may still be held (its report lost)
    sentinel.stop(report=True)  # ended without handing anything back, as a crash
    assert recorder.seen == [
        ("/v1/workers/w-1/crashed", "Bearer tok", {"started": ["b", "c"], "session": "s-1"})
    ]


def test_an_invocation_claimed_again_is_not_reported_for_its_earlier_attempt(
    recorder: Recorder,
) -> None:
    """It ended (retried later), and this daemon claimed it again: the untold end goes at
    once, so the new attempt, not begun, is not charged should the daemon die."""
    sentinel = started(recorder)
    sentinel.begin("a")
    sentinel.end("a")
    sentinel.claimed(["a", "b"])
    sentinel.stop(report=True)
    assert [body["started"] for _, _, body in recorder.seen] == [[]]


def test_the_report_is_retried_while_the_server_cannot_take_it(recorder: Recorder) -> None:
    recorder.statuses[:] = [503, 503]
    sentinel = started(recorder)
    sentinel.begin("a")
    sentinel.stop(report=True)
    assert [body["started"] for _, _, body in recorder.seen] == [["a"]] * 3


def test_a_daemon_leaving_on_its_own_is_not_reported(recorder: Recorder) -> None:
    sentinel = started(recorder)
    sentinel.begin("a")
    sentinel.stop()  # after its bye: it handed back what it held
    assert recorder.seen == []


def test_a_daemon_gone_before_its_hello_is_not_reported(recorder: Recorder) -> None:
    sentinel = Sentinel()
    sentinel.start()
    sentinel.stop(report=True)
    assert recorder.seen == []
