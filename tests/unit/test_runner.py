"""The runner: a child process per invocation, generators streamed item by item."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from lakeshore.daemon import runner


def run(fn: str, *args: Any, timeout_s: float | None = 30.0) -> tuple[runner.Outcome, list[Any]]:
    items: list[Any] = []
    outcome = runner.run(f"tests.udfs:{fn}", list(args), {}, timeout_s, items.append)
    return outcome, items


def test_a_generator_hands_on_each_item_and_returns_its_return_value() -> None:
    outcome, items = run("count", 4)
    assert items == [0, 1, 2, 3]
    assert (outcome.ok, outcome.result) == (True, 4)


def test_a_plain_function_streams_nothing() -> None:
    outcome, items = run("square", 7)
    assert (outcome.ok, outcome.result, items) == (True, 49, [])


def test_a_generator_that_raises_keeps_the_items_before_and_reports_the_error() -> None:
    outcome, items = run("fails_midway")
    assert items == ["a", "b"]
    assert not outcome.ok
    assert (outcome.error["type"], outcome.error["message"], outcome.retry) == (
        "ValueError",
        "midway",
        True,
    )
    assert "midway" in outcome.error["traceback"]


def test_an_item_that_is_not_json_fails_without_retry() -> None:
    outcome, items = run("bad_item")
    assert items == [1]
    assert (outcome.ok, outcome.retry, outcome.error["type"]) == (False, False, "TypeError")
    assert "item 1 yielded by tests.udfs:bad_item" in outcome.error["message"]


def test_the_timeout_covers_the_whole_generator(tmp_path: Any) -> None:
    """A generator that yields and then blocks is killed at its timeout, items kept."""
    outcome, items = run("gated", 3, str(tmp_path / "never"), timeout_s=0.5)
    assert items == [0]
    assert (outcome.ok, outcome.error["type"]) == (False, "TimeoutError")


def test_kill_stops_the_child_and_the_wait_ends() -> None:
    """A daemon that loses a lease kills the child; the thread waiting on it returns."""
    run = runner.Run("tests.udfs:sleep", [60], {}, None)
    run.start()
    waiter = ThreadPoolExecutor(1)
    outcome = waiter.submit(run.wait)
    run.kill()
    result = outcome.result(timeout=30)
    waiter.shutdown()
    assert (result.ok, result.error["type"]) == (False, "Stopped")


def test_kill_before_start_stops_the_child_as_it_starts() -> None:
    run = runner.Run("tests.udfs:sleep", [60], {}, None)
    run.kill()
    result = run()
    assert (result.ok, result.error["type"]) == (False, "Stopped")


def _gone(pid: int) -> bool:
    """Dead or a zombie (exited, waiting for a parent that is not this test to reap it)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status


def _pids(path: Path) -> list[int]:
    return [int(p) for p in path.read_text().split()]


def _gone_soon(pid: int) -> bool:
    """SIGKILL is delivered asynchronously: look a bounded number of times."""
    for _ in range(200):
        if _gone(pid):
            return True
        time.sleep(0.01)
    return False


def test_a_process_the_udf_started_ends_with_its_invocation(tmp_path: Path) -> None:
    outcome = runner.run("tests.udfs_burst:spawn_then_wait", [str(tmp_path / "p"), 0], {}, 30)
    assert outcome.ok, outcome
    child, grandchild = _pids(tmp_path / "p")
    assert outcome.result == grandchild
    assert _gone_soon(grandchild) and _gone_soon(child)


def test_a_process_the_udf_started_ends_with_its_timeout(tmp_path: Path) -> None:
    args = [str(tmp_path / "p"), 60]
    outcome = runner.run("tests.udfs_burst:spawn_then_wait", args, {}, 1.0)
    assert outcome.error["type"] == "TimeoutError"
    assert all(_gone_soon(pid) for pid in _pids(tmp_path / "p"))


def test_a_process_the_udf_started_ends_when_its_invocation_is_stopped(tmp_path: Path) -> None:
    path = tmp_path / "p"
    run = runner.Run("tests.udfs_burst:spawn_then_wait", [str(path), 60], {}, None)
    run.start()
    waiter = ThreadPoolExecutor(1)
    outcome = waiter.submit(run.wait)
    for _ in range(1000):  # bounded: the UDF writes its pids as it starts
        if path.exists() and len(path.read_text().split()) == 2:
            break
        time.sleep(0.01)
    run.kill()
    assert outcome.result(timeout=30).error["type"] == "Stopped"
    waiter.shutdown()
    assert all(_gone_soon(pid) for pid in _pids(path))
