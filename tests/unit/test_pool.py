"""The warm pool through the runner: children kept between invocations, replaced when one
crashes, times out or is recycled; set-up hooks once per child; ``async def`` UDFs."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from lakeshore.daemon import runner
from lakeshore.daemon.pool import Pool, PoolConfig
from tests.unit.test_runner import _gone_soon, _pids, invocation


@pytest.fixture
async def processes() -> AsyncIterator[runner.Processes]:
    processes = runner.Processes()
    yield processes
    await processes.close()


def make(**config: Any) -> runner.Processes:
    return runner.Processes(PoolConfig(**config))


async def run(
    processes: runner.Processes, fn: str, *args: Any, timeout_s: float | None = 30.0
) -> runner.Outcome:
    return await processes.run(invocation(f"tests.udfs_pool:{fn}", *args, timeout_s=timeout_s))


async def wait_until(predicate: Any, what: str) -> None:
    for _ in range(3000):  # bounded: at most a minute
        if predicate():
            return
        await asyncio.sleep(0.02)
    pytest.fail(f"gave up waiting for {what}")


async def test_state_one_invocation_leaves_is_there_for_the_next(
    processes: runner.Processes,
) -> None:
    first, second = await run(processes, "remember", 1), await run(processes, "remember", 2)
    assert first.result["seen"] == [1]
    assert second.result == {"pid": first.result["pid"], "seen": [1, 2]}
    assert processes.pool.started == 1


async def test_the_set_up_hook_runs_once_per_child(processes: runner.Processes) -> None:
    results = [(await run(processes, "predict", x)).result for x in range(3)]
    assert [r["y"] for r in results] == [0, 2, 4]
    assert {r["setups"] for r in results} == {1}
    assert len({r["pid"] for r in results}) == 1


async def test_a_set_up_that_raises_fails_the_invocation_it_holds_up_and_is_tried_again(
    processes: runner.Processes,
) -> None:
    failed = await run(processes, "after_flaky_setup")
    assert (failed.ok, failed.retry, failed.error["type"]) == (False, True, "RuntimeError")
    assert failed.error["message"] == (
        "set-up tests.udfs_pool:flaky_setup failed: the GPU is not ready yet"
    )
    assert "flaky_setup" in failed.error["traceback"]
    again = await run(processes, "after_flaky_setup")
    assert again.ok and again.result["setup_calls"] == 2


async def test_preloaded_modules_are_imported_in_the_child_before_its_first_invocation() -> None:
    plain, preloading = make(), make(preload=["tests.udfs_preloaded"])
    try:
        assert (await run(plain, "preloaded")).result is None
        assert (await run(preloading, "preloaded")).result is True
    finally:
        await plain.close()
        await preloading.close()


async def test_a_preload_that_fails_is_reported_on_the_invocation() -> None:
    processes = make(preload=["tests.no_such_module"])
    try:
        outcome = await run(processes, "pid")
    finally:
        await processes.close()
    assert (outcome.ok, outcome.error["type"]) == (False, "ModuleNotFoundError")
    assert outcome.error["message"].startswith("--preload tests.no_such_module failed")


async def test_a_child_that_aborts_fails_only_its_invocation_and_is_replaced(
    processes: runner.Processes, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    patient = asyncio.create_task(run(processes, "wait_for_file", str(gate)))
    try:
        await wait_until(lambda: len(processes.pool.children) == 1, "the first child")
        crashed = await run(processes, "abort")  # a second child: the first one is busy
        assert (crashed.ok, crashed.error["type"]) == (False, "WorkerCrash")
        assert "died (exit code -6)" in crashed.error["message"]
        gate.touch()
        survivor = await patient
    finally:
        gate.touch()
    assert survivor.ok
    replacement = await run(processes, "pid")
    assert replacement.ok and processes.pool.started == 2  # the idle survivor took it
    assert replacement.result == survivor.result


async def test_a_child_that_exits_mid_invocation_fails_it_and_the_next_gets_a_new_child(
    processes: runner.Processes,
) -> None:
    before = (await run(processes, "pid")).result
    crashed = await processes.run(invocation("tests.udfs:crash"))
    assert crashed.error["type"] == "WorkerCrash"
    assert "exit code 3" in crashed.error["message"]
    after = (await run(processes, "pid")).result
    assert after != before and processes.pool.started == 2


async def test_a_timed_out_child_is_killed_and_replaced(
    processes: runner.Processes, tmp_path: Path
) -> None:
    pid_file = tmp_path / "pid"
    sleeping = invocation("tests.udfs:pid_then_sleep", str(pid_file), 60, timeout_s=0.5)
    outcome = await processes.run(sleeping)
    assert outcome.error["type"] == "TimeoutError"
    pid = int(pid_file.read_text())
    assert _gone_soon(pid)
    assert (await run(processes, "pid")).result != pid


async def test_set_up_time_is_not_counted_in_the_timeout() -> None:
    """The preload takes its time; the invocation's short timeout starts after it."""
    processes = make(preload=["tests.udfs_heavy"])
    try:
        assert (await run(processes, "pid", timeout_s=5.0)).ok
    finally:
        await processes.close()


async def test_a_child_is_recycled_after_max_invocations() -> None:
    processes = make(max_invocations_per_child=2)
    try:
        pids = [(await run(processes, "pid")).result for _ in range(5)]
    finally:
        await processes.close()
    assert pids[0] == pids[1] != pids[2] == pids[3] != pids[4]
    assert processes.pool.started == 3


async def test_a_child_is_recycled_after_an_invocation_that_leaves_it_over_max_memory() -> None:
    processes = make(max_memory_per_child_mb=1)  # any Python process holds more
    try:
        pids = [(await run(processes, "pid")).result for _ in range(3)]
    finally:
        await processes.close()
    assert len(set(pids)) == 3


async def test_what_a_udf_left_running_ends_with_its_invocation_while_the_child_stays(
    processes: runner.Processes, tmp_path: Path
) -> None:
    path = tmp_path / "p"
    outcome = await processes.run(invocation("tests.udfs_burst:spawn_then_wait", str(path), 0))
    assert outcome.ok
    child, grandchild = _pids(path)
    assert _gone_soon(grandchild)
    assert processes.pool.children == [child]


async def test_a_stopped_invocation_takes_its_child_and_the_next_gets_a_new_one(
    processes: runner.Processes,
) -> None:
    stopping = runner.Run(processes.pool, invocation("tests.udfs:sleep", 60, timeout_s=None))
    outcome = stopping.begin()
    stopping.kill()
    assert (await outcome).error["type"] == "Stopped"
    assert (await run(processes, "pid")).ok and processes.pool.started == 2


# --- a warm pool ------------------------------------------------------------------------


async def test_a_warm_pool_starts_its_children_before_any_work_and_uses_them() -> None:
    processes = runner.Processes()
    try:
        processes.pool.warm(2)
        assert processes.pool.started == 2 and len(processes.pool.children) == 2
        pids = {(await run(processes, "pid")).result for _ in range(3)}
        assert pids <= set(processes.pool.children) and processes.pool.started == 2
    finally:
        await processes.close()


async def test_a_warm_child_that_dies_is_replaced_ahead_of_the_next_invocation() -> None:
    processes = runner.Processes()
    pool = processes.pool
    try:
        pool.warm(2)
        first = pool.children
        os.kill(first[0], signal.SIGKILL)
        await wait_until(
            lambda: first[0] not in pool.children and len(pool.children) == 2, "a new child"
        )
        assert pool.started == 3
        assert (await run(processes, "pid")).ok and pool.started == 3
    finally:
        await processes.close()


async def test_warmed_waits_until_every_child_has_started_up() -> None:
    processes = runner.Processes()
    try:
        processes.warm(2)
        assert await processes.pool.warmed(60.0)
        outcome = await run(processes, "pid")
        assert outcome.result in processes.pool.children and processes.pool.started == 2
    finally:
        await processes.close()


def test_a_runner_warms_one_child_per_slot_or_as_few_as_hold_its_async_capacity() -> None:
    assert runner.warm_children(8, PoolConfig()) == 8
    assert runner.warm_children(64, PoolConfig(async_concurrency=16)) == 4
    assert runner.warm_children(5, PoolConfig(async_concurrency=2)) == 3


# --- async def ---------------------------------------------------------------------------


async def test_an_async_def_udf_returns_its_result(processes: runner.Processes) -> None:
    assert (await run(processes, "async_square", 7)).result == 49


async def test_an_async_generator_streams_its_items(processes: runner.Processes) -> None:
    items: list[Any] = []
    outcome = await processes.run(invocation("tests.udfs_pool:async_count", 3), items.append)
    assert (outcome.ok, outcome.result, items) == (True, None, [0, 1, 2])


async def test_async_errors_and_results_that_are_not_json_fail_as_plain_ones_do(
    processes: runner.Processes,
) -> None:
    boom = await run(processes, "async_boom")
    assert (boom.error["type"], boom.error["message"], boom.retry) == (
        "ValueError",
        "async boom",
        True,
    )
    not_json = await run(processes, "async_not_json")
    assert (not_json.error["type"], not_json.retry) == ("TypeError", False)


async def test_an_async_udf_past_its_timeout_is_cancelled_and_its_child_kept(
    processes: runner.Processes,
) -> None:
    warm = (await run(processes, "pid")).result
    outcome = await run(processes, "async_sleep", 60, timeout_s=0.5)
    assert (outcome.ok, outcome.error["type"]) == (False, "TimeoutError")
    assert (await run(processes, "pid")).result == warm and processes.pool.started == 1


async def test_a_stopped_async_udf_is_cancelled_in_its_child(
    processes: runner.Processes, tmp_path: Path
) -> None:
    items: list[Any] = []
    gate = tmp_path / "never"
    gated = invocation("tests.udfs_pool:async_gated", str(gate), timeout_s=None)
    running = asyncio.create_task(processes.run(gated, items.append))
    await wait_until(lambda: items == [0], "the first item")
    running.cancel()  # as a lost lease does: the child cancels it, and is kept
    with pytest.raises(asyncio.CancelledError):
        await running
    stopping = runner.Run(processes.pool, gated, items.append)
    outcome = stopping.begin()
    await wait_until(lambda: items == [0, 0], "the first item again")
    stopping.kill()
    assert (await outcome).error["type"] == "Stopped"
    assert processes.pool.started == 1 and len(processes.pool.children) == 1


async def test_a_child_runs_async_invocations_together_up_to_its_concurrency() -> None:
    processes = make(async_concurrency=3)
    try:
        # the pool learns that a function is async from its first run: until then it
        # gives each invocation a child of its own
        assert (await run(processes, "together", "alone", 1)).ok
        outcomes = await asyncio.gather(*(run(processes, "together", "g", 3) for _ in range(3)))
    finally:
        await processes.close()
    assert all(o.ok for o in outcomes), ([o.error for o in outcomes], processes.pool.started)
    assert len({o.result for o in outcomes}) == 1 and processes.pool.started == 1


async def test_an_async_udf_that_blocks_its_loop_past_its_timeout_has_its_child_killed() -> None:
    """It cannot be cancelled; once it has not given way, its child goes, and the other
    invocation in that child fails as in a crash (and would be retried)."""
    processes = make(async_concurrency=2)
    try:
        # the pool learns both are async, so they share the child
        assert (await run(processes, "blocks_its_loop", 0)).ok
        assert (await run(processes, "async_sleep", 0)).ok
        beside = asyncio.create_task(run(processes, "async_sleep", 60, timeout_s=None))
        await wait_until(lambda: len(processes.pool.children) == 1, "the child")
        blocked = await run(processes, "blocks_its_loop", 60, timeout_s=0.5)
        other = await beside
    finally:
        await processes.close()
    assert processes.pool.started == 1
    assert (blocked.ok, blocked.error["type"]) == (False, "TimeoutError")
    assert (other.ok, other.retry, other.error["type"]) == (False, True, "WorkerCrash")
    assert "did not give way" in other.error["message"]


# --- the pool's loop ----------------------------------------------------------------------


async def test_an_invocation_that_times_out_leaves_the_next_a_new_child(
    processes: runner.Processes,
) -> None:
    outcome = await processes.run(invocation("tests.udfs:sleep", 60, timeout_s=0.5))
    assert outcome.error["type"] == "TimeoutError"
    after = await run(processes, "pid")
    assert after.ok and processes.pool.started == 2


async def test_an_invocation_on_the_loop_is_stopped_by_a_kill_from_another_thread(
    processes: runner.Processes,
) -> None:
    run_ = runner.Run(processes.pool, invocation("tests.udfs:sleep", 60, timeout_s=None))
    outcome = run_.begin()
    await asyncio.to_thread(run_.kill)
    assert (await outcome).error["type"] == "Stopped"


def test_a_pool_is_read_on_the_loop_it_is_made_on() -> None:
    with pytest.raises(RuntimeError):
        Pool()  # no running loop, and none given


def test_close_reaps_every_child_even_when_the_loop_that_reads_them_has_stopped() -> None:
    loop = asyncio.new_event_loop()
    try:
        pool = Pool(loop=loop)
        pool.warm(2)  # started from this thread: the loop, not running, never reads them
        children = [child.process for child in pool._children]
        pool.close(within_s=0.5)
        assert all(process.returncode is not None for process in children)
        assert pool.children == []
    finally:
        loop.close()
