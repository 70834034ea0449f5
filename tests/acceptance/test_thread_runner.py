"""Real daemons with ``--runner thread``: invocations run in the daemon's own process and
share its memory, a set-up hook runs once per daemon, generators and async functions
stream and return, time-outs stop plain and async functions, a cancel reaches an async
one, and a queue's template may name the runner."""

from __future__ import annotations

import itertools
from contextlib import closing
from pathlib import Path

import httpx
import pytest

from lakeshore import Client
from tests.acceptance.conftest import LakeshoreServer
from tests.acceptance.test_daemons import NS, http, server, start_daemon, stop, wait_for
from tests.acceptance.test_pool import burst, finished, show, submit_all

pytestmark = pytest.mark.acceptance

__all__ = ["http", "server"]  # the module-scoped fixtures, shared with test_daemons


def test_the_thread_runner_runs_plain_generator_and_async_udfs_in_the_daemon(
    server: LakeshoreServer, http: httpx.Client, tmp_path: Path
) -> None:
    queue = f"threads-{server.backend}"
    marker = tmp_path / "spun"
    once = {"max_attempts": 1}
    items = [
        {"fn": "tests.udfs_threads:remember", "args": ["acc", 1]},
        {"fn": "tests.udfs_threads:remember", "args": ["acc", 2]},
        *({"fn": "tests.udfs_threads:fetch", "args": [n]} for n in range(3)),
        {"fn": "tests.udfs_threads:count", "args": [3]},
        {"fn": "tests.udfs_threads:async_square", "args": [7]},
        {"fn": "tests.udfs_threads:async_count", "args": [2]},
        {"fn": "tests.udfs_threads:boom", **once},
        {"fn": "tests.udfs_threads:spin", "args": [60, str(marker)], "timeout_s": 0.5, **once},
        {"fn": "tests.udfs_threads:async_sleep", "args": [60], "timeout_s": 0.5, **once},
    ]
    ids = submit_all(http, queue, items)
    log = tmp_path / "d.log"
    burst(server, log, queue, "--runner", "thread", "--capacity", "3")
    first, second, *fetched = (show(http, i) for i in ids[:5])
    count, square, async_count, boom, spin, sleep = (show(http, i) for i in ids[5:])
    # they may run at once (capacity 3): the later sees what the earlier left
    earlier, later = sorted((first["result"]["seen"], second["result"]["seen"]), key=len)
    assert len(earlier) == 1 and sorted(later) == [1, 2]
    assert [r["result"]["y"] for r in fetched] == [1, 2, 3]
    assert {r["result"]["setups"] for r in fetched} == {1}  # once per daemon
    pids = {r["result"]["pid"] for r in [first, second, *fetched]}
    assert len(pids) == 1  # one process: the daemon's
    assert (count["state"], square["result"], async_count["state"]) == (
        "succeeded",
        49,
        "succeeded",
    )
    with Client(server.url, server.admin_token) as client:
        for invocation, expected in ((ids[5], [0, 1, 2]), (ids[7], [0, 1])):
            with closing(client.follow(invocation)) as events:
                streamed = list(itertools.islice(events, 10))
            assert [item for kind, item in streamed if kind == "item"] == expected
    assert (boom["state"], boom["error"]["message"]) == ("failed", "thread boom")
    assert (spin["state"], spin["error"]["type"]) == ("failed", "TimeoutError")
    assert not marker.exists()  # stopped in its thread, not left to run on
    assert (sleep["state"], sleep["error"]["type"]) == ("failed", "TimeoutError")
    assert "runs on in its thread" not in log.read_text()  # the stop ended it


def test_a_cancel_reaches_an_async_udf_on_the_thread_runner(
    server: LakeshoreServer, http: httpx.Client, tmp_path: Path
) -> None:
    queue = f"threads-cancel-{server.backend}"
    daemon = start_daemon(server, tmp_path / "d.log", "--queue", queue, "--runner", "thread")
    try:
        (doomed,) = submit_all(
            http, queue, [{"fn": "tests.udfs_threads:async_sleep", "args": [120]}]
        )
        wait_for(lambda: show(http, doomed)["state"] == "running", 30, "the UDF to start")
        assert http.post(f"{NS}/invocations/{doomed}/cancel").status_code == 200
        # capacity 1: the next runs only once the cancelled one has given way
        (after,) = finished(
            http, submit_all(http, queue, [{"fn": "tests.udfs_threads:async_square", "args": [3]}])
        )
    finally:
        stop(daemon)
    assert show(http, doomed)["state"] == "cancelled"
    assert (after["state"], after["result"]) == ("succeeded", 9)
