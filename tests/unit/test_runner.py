"""The process runner: each invocation in a pool child, generators streamed item by item,
on the event loop the daemon runs (:class:`runner.Processes`, :class:`runner.Run`)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from lakeshore.daemon import runner
from lakeshore.daemon.runners import Invocation

_ids = itertools.count()


def invocation(fn: str, *args: Any, timeout_s: float | None = 30.0) -> Invocation:
    return Invocation(f"inv-{next(_ids)}", fn, list(args), {}, timeout_s)


@pytest.fixture
async def processes() -> AsyncIterator[runner.Processes]:
    processes = runner.Processes()
    yield processes
    await processes.close()


async def run(
    processes: runner.Processes, fn: str, *args: Any, timeout_s: float | None = 30.0
) -> tuple[runner.Outcome, list[Any]]:
    items: list[Any] = []
    outcome = await processes.run(
        invocation(f"tests.udfs:{fn}", *args, timeout_s=timeout_s), items.append
    )
    return outcome, items


async def test_a_generator_hands_on_each_item_and_returns_its_return_value(
    processes: runner.Processes,
) -> None:
    outcome, items = await run(processes, "count", 4)
    assert items == [0, 1, 2, 3]
    assert (outcome.ok, outcome.result) == (True, 4)


async def test_a_plain_function_streams_nothing(processes: runner.Processes) -> None:
    outcome, items = await run(processes, "square", 7)
    assert (outcome.ok, outcome.result, items) == (True, 49, [])


async def test_a_generator_that_raises_keeps_the_items_before_and_reports_the_error(
    processes: runner.Processes,
) -> None:
    outcome, items = await run(processes, "fails_midway")
    assert items == ["a", "b"]
    assert not outcome.ok
    assert (outcome.error["type"], outcome.error["message"], outcome.retry) == (
        "ValueError",
        "midway",
        True,
    )
    assert "midway" in outcome.error["traceback"]


async def test_an_item_that_is_not_json_fails_without_retry(processes: runner.Processes) -> None:
    outcome, items = await run(processes, "bad_item")
    assert items == [1]
    assert (outcome.ok, outcome.retry, outcome.error["type"]) == (False, False, "TypeError")
    assert "item 1 yielded by tests.udfs:bad_item" in outcome.error["message"]


async def test_the_timeout_covers_the_whole_generator(
    processes: runner.Processes, tmp_path: Path
) -> None:
    """A generator that yields and then blocks is killed at its timeout, items kept."""
    outcome, items = await run(processes, "gated", 3, str(tmp_path / "never"), timeout_s=0.5)
    assert items == [0]
    assert (outcome.ok, outcome.error["type"]) == (False, "TimeoutError")


async def test_kill_stops_the_child_and_the_run_ends(processes: runner.Processes) -> None:
    """A daemon that loses a lease kills the child; the run's outcome comes at once."""
    run_ = runner.Run(processes.pool, invocation("tests.udfs:sleep", 60, timeout_s=None))
    outcome = run_.begin()
    run_.kill()
    result = await outcome
    assert (result.ok, result.error["type"]) == (False, "Stopped")


async def test_kill_before_begin_stops_the_child_as_it_starts(
    processes: runner.Processes,
) -> None:
    run_ = runner.Run(processes.pool, invocation("tests.udfs:sleep", 60, timeout_s=None))
    run_.kill()
    result = await run_.begin()
    assert (result.ok, result.error["type"]) == (False, "Stopped")


async def test_a_cancelled_run_goes_on_being_cancelled_only_once_its_child_is_gone(
    processes: runner.Processes, tmp_path: Path
) -> None:
    """A lost lease cancels the daemon's task: the child is killed, and the cancel ends
    the task only once the child has been reaped (its slot is held until then)."""
    path = tmp_path / "pid"
    running = asyncio.create_task(
        processes.run(invocation("tests.udfs:pid_then_sleep", str(path), 60, timeout_s=None))
    )
    await _written(path)
    pid = int(path.read_text())
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert pid not in processes.pool.children
    assert _gone_soon(pid)


async def _written(path: Path, lines: int = 1) -> None:
    for _ in range(3000):  # bounded: the UDF writes its pid(s) as it starts
        if _has_lines(path, lines):
            return
        await asyncio.sleep(0.01)
    pytest.fail(f"gave up waiting for {path}")


def _has_lines(path: Path, lines: int) -> bool:
    return path.exists() and len(path.read_text().split()) >= lines


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


async def test_a_process_the_udf_started_ends_with_its_invocation(
    processes: runner.Processes, tmp_path: Path
) -> None:
    path = tmp_path / "p"
    outcome = await processes.run(invocation("tests.udfs_burst:spawn_then_wait", str(path), 0))
    assert outcome.ok, outcome
    child, grandchild = _pids(path)
    assert outcome.result == grandchild
    assert _gone_soon(grandchild)
    await processes.close()
    assert _gone_soon(child)


async def test_a_process_the_udf_started_ends_with_its_timeout(
    processes: runner.Processes, tmp_path: Path
) -> None:
    args = [str(tmp_path / "p"), 60]
    outcome = await processes.run(
        invocation("tests.udfs_burst:spawn_then_wait", *args, timeout_s=1.0)
    )
    assert outcome.error["type"] == "TimeoutError"
    assert all(_gone_soon(pid) for pid in _pids(tmp_path / "p"))


async def test_a_process_the_udf_started_ends_when_its_invocation_is_stopped(
    processes: runner.Processes, tmp_path: Path
) -> None:
    path = tmp_path / "p"
    run_ = runner.Run(
        processes.pool,
        invocation("tests.udfs_burst:spawn_then_wait", str(path), 60, timeout_s=None),
    )
    outcome = run_.begin()
    await _written(path, lines=2)
    run_.kill()
    assert (await outcome).error["type"] == "Stopped"
    assert all(_gone_soon(pid) for pid in _pids(path))
