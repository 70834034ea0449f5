"""The thread runner: invocations on the daemon's own threads, warm state shared by all
of them, set-up hooks once per daemon, ``async def`` on one event loop, time-outs and
stops that end the invocation."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from lakeshore.daemon import runner
from lakeshore.daemon.threads import Threads


@pytest.fixture
def threads() -> Iterator[Threads]:
    runner_ = Threads()
    yield runner_
    runner_.close()


def run(
    threads: Threads,
    fn: str,
    *args: Any,
    timeout_s: float | None = 30.0,
    items: list[Any] | None = None,
) -> runner.Outcome:
    on_item = None if items is None else items.append
    return threads.run(f"tests.udfs_threads:{fn}", list(args), {}, timeout_s, on_item)()


def test_invocations_run_in_the_daemons_process_and_share_its_state(
    threads: Threads, tmp_path: Path
) -> None:
    # a key of this run's own: `make mutate` runs the unit tests twice in one process
    key = str(tmp_path)
    first, second = run(threads, "remember", key, 1), run(threads, "remember", key, 2)
    assert first.result["pid"] == os.getpid() == second.result["pid"]
    assert second.result["seen"] == [1, 2]
    assert first.result["thread"] != threading.get_ident()  # not the caller's thread


def test_the_set_up_hook_runs_once_per_runner(threads: Threads) -> None:
    import tests.udfs_threads as udfs

    before = udfs.SETUPS
    results = [run(threads, "fetch", x).result for x in range(3)]
    assert [r["y"] for r in results] == [1, 2, 3]
    assert before + 1 == udfs.SETUPS


def test_a_generator_streams_its_items_and_errors_are_reported(threads: Threads) -> None:
    items: list[Any] = []
    assert run(threads, "count", 3, items=items).ok and items == [0, 1, 2]
    failed = run(threads, "boom")
    assert (failed.ok, failed.error["type"], failed.error["message"]) == (
        False,
        "ValueError",
        "thread boom",
    )
    assert "boom" in failed.error["traceback"]
    missing = threads.run("tests.udfs_threads:nope", [], {}, 5.0)()
    assert not missing.ok and missing.error["type"] == "AttributeError"


def test_a_plain_function_past_its_timeout_is_stopped_in_its_thread(
    threads: Threads, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    outcome = run(threads, "spin", 30.0, str(marker), timeout_s=0.2)
    assert (outcome.ok, outcome.error["type"]) == (False, "TimeoutError")
    assert outcome.error["message"] == "tests.udfs_threads:spin ran past its timeout of 0.2 s"
    assert not marker.exists()


def test_a_stop_ends_even_a_function_that_swallows_exceptions(threads: Threads) -> None:
    invocation = threads.run("tests.udfs_threads:spin_ignoring_errors", [30.0], {}, None)
    with ThreadPoolExecutor(1) as executor:
        future = executor.submit(invocation)
        invocation.kill()
        outcome = future.result(timeout=30)
    assert (outcome.ok, outcome.error["type"]) == (False, "Stopped")


def test_async_functions_and_generators_run_on_the_runners_loop(threads: Threads) -> None:
    assert run(threads, "async_square", 7).result == 49
    items: list[Any] = []
    assert run(threads, "async_count", 3, items=items).ok and items == [0, 1, 2]
    late = run(threads, "async_sleep", 30.0, timeout_s=0.1)
    assert (late.ok, late.error["type"]) == (False, "TimeoutError")


def test_async_invocations_run_together_and_a_stopped_one_is_cancelled(
    threads: Threads,
) -> None:
    with ThreadPoolExecutor(4) as executor:
        together = [
            executor.submit(run, threads, "together", "t", 3, timeout_s=30.0) for _ in range(3)
        ]
        assert [f.result(timeout=40).result for f in together] == [os.getpid()] * 3
        sleeping = threads.run("tests.udfs_threads:async_sleep", [30.0], {}, None)
        future = executor.submit(sleeping)
        sleeping.kill()
        outcome = future.result(timeout=30)
    assert (outcome.ok, outcome.error["type"]) == (False, "Stopped")
