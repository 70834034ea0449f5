"""Real daemons and their warm pool: state kept between invocations in a child, set-up
hooks once per child, a child that crashes or times out replaced while the others run on,
recycling, ``async def`` UDFs, and nothing left alive when the daemon is killed."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
from collections import Counter
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest

from lakeshore import Client
from tests.acceptance.conftest import LakeshoreServer
from tests.acceptance.test_daemons import NS, gone, http, server, start_daemon, stop, wait_for

pytestmark = pytest.mark.acceptance

__all__ = ["http", "server"]  # the module-scoped fixtures, shared with test_daemons

FINAL = ("succeeded", "failed", "cancelled")


def submit_all(http: httpx.Client, queue: str, items: list[dict[str, Any]]) -> list[str]:
    response = http.post(f"{NS}/queues/{queue}/invocations/batch", json={"invocations": items})
    assert response.status_code == 201, response.text
    return [i["id"] for i in response.json()["invocations"]]


def show(http: httpx.Client, invocation_id: str) -> dict[str, Any]:
    info: dict[str, Any] = http.get(f"{NS}/invocations/{invocation_id}").json()
    return info


def finished(http: httpx.Client, ids: list[str], timeout_s: float = 60) -> list[dict[str, Any]]:
    def look() -> list[dict[str, Any]] | None:
        infos = [show(http, i) for i in ids]
        return infos if all(i["state"] in FINAL for i in infos) else None

    result: list[dict[str, Any]] = wait_for(look, timeout_s, "the invocations to finish")
    return result


def burst(server: LakeshoreServer, log: Path, queue: str, *args: str) -> None:
    daemon = start_daemon(server, log, "--queue", queue, "--burst", *args)
    try:
        assert daemon.wait(timeout=120) == 0, log.read_text()
    finally:
        stop(daemon)


def test_state_and_the_set_up_hook_stay_warm_in_a_child(
    server: LakeshoreServer, http: httpx.Client, tmp_path: Path
) -> None:
    queue = f"warm-{server.backend}"
    items = [{"fn": "tests.udfs_pool:remember", "args": [n]} for n in range(3)]
    items += [{"fn": "tests.udfs_pool:predict", "args": [n]} for n in range(3)]
    ids = submit_all(http, queue, items)
    burst(server, tmp_path / "d.log", queue)
    results = [show(http, i)["result"] for i in ids]
    assert [r["seen"] for r in results[:3]] == [[0], [0, 1], [0, 1, 2]]
    assert [(r["y"], r["setups"]) for r in results[3:]] == [(0, 1), (2, 1), (4, 1)]
    assert len({r["pid"] for r in results}) == 1  # one child ran them all


def test_a_child_that_runs_only_plain_functions_never_loads_asyncio(
    server: LakeshoreServer, http: httpx.Client, tmp_path: Path
) -> None:
    """The event loop (and asyncio, a third of a bare child's imports) is made only
    for work that needs it: a child serving plain functions starts and runs without."""
    queue = f"plain-{server.backend}"
    call = {"fn": "tests.udfs:loaded", "args": [["asyncio", "lakeshore.daemon.calls"]]}
    ids = submit_all(http, queue, [call, call])
    burst(server, tmp_path / "d.log", queue, "--capacity", "1")
    for info in finished(http, ids):
        assert info["result"] == {"asyncio": False, "lakeshore.daemon.calls": True}


def test_a_set_up_that_raises_fails_its_invocation_with_its_traceback(
    server: LakeshoreServer, http: httpx.Client, tmp_path: Path
) -> None:
    queue = f"setup-fails-{server.backend}"
    item = {"fn": "tests.udfs_pool:after_flaky_setup", "max_attempts": 1}
    retried = {**item, "max_attempts": 2}
    ids = submit_all(http, queue, [item])
    burst(server, tmp_path / "d.log", queue)
    failed = show(http, ids[0])
    assert (failed["state"], failed["error"]["type"]) == ("failed", "RuntimeError")
    assert "set-up tests.udfs_pool:flaky_setup failed" in failed["error"]["message"]
    assert "the GPU is not ready yet" in failed["error"]["traceback"]
    ids = submit_all(http, queue, [retried])  # a new daemon, a new child: fails, then works
    burst(server, tmp_path / "d.log", queue)
    final = show(http, ids[0])
    assert (final["state"], final["attempts"], final["result"]["setup_calls"]) == (
        "succeeded",
        2,
        2,
    )


def test_a_child_that_aborts_fails_only_its_invocation_while_another_child_completes(
    server: LakeshoreServer, http: httpx.Client, tmp_path: Path
) -> None:
    queue = f"abort-{server.backend}"
    gate = tmp_path / "gate"
    daemon = start_daemon(server, tmp_path / "d.log", "--queue", queue, "--capacity", "2")
    try:
        (patient,) = submit_all(
            http, queue, [{"fn": "tests.udfs_pool:wait_for_file", "args": [str(gate)]}]
        )
        wait_for(lambda: show(http, patient)["state"] == "running", 30, "the first to run")
        crashing = [
            {"fn": "tests.udfs_pool:abort", "max_attempts": 1},
            {"fn": "tests.udfs_pool:crash_once", "args": [str(tmp_path / "m")], "max_attempts": 2},
        ]
        aborted, once = finished(http, submit_all(http, queue, crashing))
        assert show(http, patient)["state"] == "running"  # untouched by the crashes
        gate.touch()
        (survivor,) = finished(http, [patient])
    finally:
        gate.touch()
        stop(daemon)
    assert (aborted["state"], aborted["error"]["type"]) == ("failed", "WorkerCrash")
    assert "exit code -6" in aborted["error"]["message"]
    assert (once["state"], once["attempts"]) == ("succeeded", 2)  # retried in a new child
    assert survivor["state"] == "succeeded"
    assert survivor["result"] != once["result"]  # the survivor's child was never replaced


def test_a_timed_out_child_is_killed_and_the_next_invocation_gets_a_new_one(
    server: LakeshoreServer, http: httpx.Client, tmp_path: Path
) -> None:
    queue = f"timeout-{server.backend}"
    pid_file = tmp_path / "pid"
    slow = {"fn": "tests.udfs:pid_then_sleep", "args": [str(pid_file), 60], "timeout_s": 0.5}
    ids = submit_all(http, queue, [{**slow, "max_attempts": 1}, {"fn": "tests.udfs_pool:pid"}])
    burst(server, tmp_path / "d.log", queue)
    timed_out, after = (show(http, i) for i in ids)
    assert (timed_out["state"], timed_out["error"]["type"]) == ("failed", "TimeoutError")
    killed = int(pid_file.read_text())
    assert gone(killed)
    assert after["state"] == "succeeded" and after["result"] != killed


def test_a_child_is_recycled_after_its_max_invocations(
    server: LakeshoreServer, http: httpx.Client, tmp_path: Path
) -> None:
    queue = f"recycle-{server.backend}"
    ids = submit_all(
        http, queue, [{"fn": "tests.udfs_pool:predict", "args": [n]} for n in range(5)]
    )
    burst(server, tmp_path / "d.log", queue, "--max-invocations-per-child", "2")
    results = [show(http, i)["result"] for i in ids]
    assert sorted(Counter(r["pid"] for r in results).values()) == [1, 2, 2]
    assert {r["setups"] for r in results} == {1}  # each new child set up once


def test_async_udfs_return_stream_time_out_and_fail_like_plain_ones(
    server: LakeshoreServer, http: httpx.Client, tmp_path: Path
) -> None:
    queue = f"async-{server.backend}"
    items = [
        {"fn": "tests.udfs_pool:async_square", "args": [7]},
        {"fn": "tests.udfs_pool:async_count", "args": [3]},
        {"fn": "tests.udfs_pool:async_sleep", "args": [60], "timeout_s": 0.5, "max_attempts": 1},
        {"fn": "tests.udfs_pool:async_boom", "max_attempts": 1},
        {"fn": "tests.udfs_pool:async_not_json", "max_attempts": 3},
    ]
    ids = submit_all(http, queue, items)
    burst(server, tmp_path / "d.log", queue, "--capacity", "4", "--async-concurrency", "4")
    square, count, slow, boom, not_json = (show(http, i) for i in ids)
    assert (square["state"], square["result"]) == ("succeeded", 49)
    assert count["state"] == "succeeded"
    with Client(server.url, server.admin_token) as client, closing(client.follow(ids[1])) as ev:
        streamed = list(itertools.islice(ev, 10))
    assert [item for kind, item in streamed if kind == "item"] == [0, 1, 2]
    assert (slow["state"], slow["error"]["type"]) == ("failed", "TimeoutError")
    assert (boom["error"]["type"], boom["error"]["message"]) == ("ValueError", "async boom")
    assert (not_json["attempts"], not_json["error"]["type"]) == (1, "TypeError")


def test_a_cancelled_async_udf_is_cancelled_in_its_child_which_stays(
    server: LakeshoreServer, http: httpx.Client, tmp_path: Path
) -> None:
    queue = f"async-cancel-{server.backend}"
    pid_file = tmp_path / "pid"
    daemon = start_daemon(server, tmp_path / "d.log", "--queue", queue)  # capacity 1
    try:
        body = {"fn": "tests.udfs_pool:async_pid_then_sleep", "args": [str(pid_file), 120]}
        (doomed,) = submit_all(http, queue, [body])
        child = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), 30, "the UDF"))
        assert http.post(f"{NS}/invocations/{doomed}/cancel").status_code == 200
        # its one slot is free again only once the run has ended in the child
        (after,) = finished(http, submit_all(http, queue, [{"fn": "tests.udfs_pool:pid"}]))
    finally:
        stop(daemon)
    assert show(http, doomed)["state"] == "cancelled"
    assert (after["state"], after["result"]) == ("succeeded", child)


def test_a_child_runs_async_invocations_together(
    server: LakeshoreServer, http: httpx.Client, tmp_path: Path
) -> None:
    queue = f"async-together-{server.backend}"
    args = ("--queue", queue, "--capacity", "3", "--async-concurrency", "3")
    daemon = start_daemon(server, tmp_path / "d.log", *args)
    try:
        # the daemon learns that the function is async from its first run
        finished(
            http, submit_all(http, queue, [{"fn": "tests.udfs_pool:together", "args": ["a", 1]}])
        )
        together = [{"fn": "tests.udfs_pool:together", "args": ["b", 3], "max_attempts": 1}] * 3
        results = finished(http, submit_all(http, queue, together))
    finally:
        stop(daemon)
    assert [r["state"] for r in results] == ["succeeded"] * 3
    assert len({r["result"] for r in results}) == 1


def test_a_daemon_killed_with_sigkill_leaves_no_idle_child(
    server: LakeshoreServer, http: httpx.Client, tmp_path: Path
) -> None:
    queue = f"idle-orphan-{server.backend}"
    daemon: subprocess.Popen[bytes] = start_daemon(server, tmp_path / "d.log", "--queue", queue)
    child = None
    try:
        (info,) = finished(http, submit_all(http, queue, [{"fn": "tests.udfs_pool:pid"}]))
        child = int(info["result"])
        assert not gone(child)  # warm, waiting for the next invocation
        daemon.send_signal(signal.SIGKILL)
        daemon.wait(timeout=10)
        wait_for(lambda: gone(child), 10, f"the idle child {child} to die with the daemon")
    finally:
        stop(daemon)
        if child is not None and not gone(child):
            os.kill(child, signal.SIGKILL)  # a failed check leaves nothing running
