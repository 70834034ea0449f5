"""The thread runner: invocations on the daemon's own threads, warm state shared by all
of them, set-up hooks once per daemon, ``async def`` on one event loop, time-outs and
stops that end the invocation; waited for on the daemon's event loop."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from lakeshore.daemon import runner
from lakeshore.daemon.threads import ThreadRun, Threads
from tests.unit.test_runner import invocation


@pytest.fixture
async def threads() -> AsyncIterator[Threads]:
    runner_ = Threads()
    yield runner_
    await runner_.close()


async def run(
    threads: Threads,
    fn: str,
    *args: Any,
    timeout_s: float | None = 30.0,
    items: list[Any] | None = None,
) -> runner.Outcome:
    on_item = None if items is None else items.append
    called = invocation(f"tests.udfs_threads:{fn}", *args, timeout_s=timeout_s)
    return await threads.run(called, on_item)


async def test_invocations_run_in_the_daemons_process_and_share_its_state(
    threads: Threads, tmp_path: Path
) -> None:
    # a key of this run's own: `make mutate` runs the unit tests twice in one process
    key = str(tmp_path)
    first, second = await run(threads, "remember", key, 1), await run(threads, "remember", key, 2)
    assert first.result["pid"] == os.getpid() == second.result["pid"]
    assert second.result["seen"] == [1, 2]
    assert first.result["thread"] != threading.get_ident()  # not the loop's thread


async def test_the_set_up_hook_runs_once_per_runner(threads: Threads) -> None:
    import tests.udfs_threads as udfs

    before = udfs.SETUPS
    results = [(await run(threads, "fetch", x)).result for x in range(3)]
    assert [r["y"] for r in results] == [1, 2, 3]
    assert before + 1 == udfs.SETUPS


async def test_a_generator_streams_its_items_and_errors_are_reported(threads: Threads) -> None:
    items: list[Any] = []
    assert (await run(threads, "count", 3, items=items)).ok and items == [0, 1, 2]
    failed = await run(threads, "boom")
    assert (failed.ok, failed.error["type"], failed.error["message"]) == (
        False,
        "ValueError",
        "thread boom",
    )
    assert "boom" in failed.error["traceback"]
    missing = await run(threads, "nope", timeout_s=5.0)
    assert not missing.ok and missing.error["type"] == "AttributeError"


async def test_a_plain_function_past_its_timeout_is_stopped_in_its_thread(
    threads: Threads, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    outcome = await run(threads, "spin", 30.0, str(marker), timeout_s=0.2)
    assert (outcome.ok, outcome.error["type"]) == (False, "TimeoutError")
    assert outcome.error["message"] == "tests.udfs_threads:spin ran past its timeout of 0.2 s"
    assert not marker.exists()


async def test_a_stop_ends_even_a_function_that_swallows_exceptions(threads: Threads) -> None:
    called = invocation("tests.udfs_threads:spin_ignoring_errors", 30.0, timeout_s=None)
    stopping = ThreadRun(threads, called, None)
    outcome = stopping.begin(threads.prepare(called.fn))
    stopping.kill()
    assert (await outcome).error["type"] == "Stopped"


async def test_a_cancelled_run_is_stopped_and_the_cancel_goes_on_once_it_has_ended(
    threads: Threads,
) -> None:
    called = invocation("tests.udfs_threads:spin_ignoring_errors", 30.0, timeout_s=None)
    threads.prepare(called.fn)  # prepared: the run begins as the task first runs
    running = asyncio.create_task(threads.run(called))
    await asyncio.sleep(0)  # begun: its thread spins
    running.cancel()  # as a lost lease does
    with pytest.raises(asyncio.CancelledError):
        await running


async def test_async_functions_and_generators_run_on_the_runners_loop(threads: Threads) -> None:
    assert (await run(threads, "async_square", 7)).result == 49
    items: list[Any] = []
    assert (await run(threads, "async_count", 3, items=items)).ok and items == [0, 1, 2]
    late = await run(threads, "async_sleep", 30.0, timeout_s=0.1)
    assert (late.ok, late.error["type"]) == (False, "TimeoutError")


async def test_async_invocations_run_together_and_a_stopped_one_is_cancelled(
    threads: Threads,
) -> None:
    together = [run(threads, "together", "t", 3, timeout_s=30.0) for _ in range(3)]
    assert [o.result for o in await asyncio.gather(*together)] == [os.getpid()] * 3
    called = invocation("tests.udfs_threads:async_sleep", 30.0, timeout_s=None)
    sleeping = ThreadRun(threads, called, None)
    outcome = sleeping.begin(threads.prepare(called.fn))
    sleeping.kill()
    assert (await outcome).error["type"] == "Stopped"
