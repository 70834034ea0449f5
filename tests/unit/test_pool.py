"""The warm pool through the runner: children kept between invocations, replaced when one
crashes, times out or is recycled; set-up hooks once per child; ``async def`` UDFs."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from lakeshore.daemon import runner, worker
from lakeshore.daemon.pool import Pool, PoolConfig
from tests.unit.test_runner import _gone_soon, _pids


@pytest.fixture
def pool() -> Iterator[Pool]:
    pool = Pool()
    yield pool
    pool.close()


def make_pool(**config: Any) -> Pool:
    return Pool(PoolConfig(**config))


def run(pool: Pool, fn: str, *args: Any, timeout_s: float | None = 30.0) -> runner.Outcome:
    return runner.run(f"tests.udfs_pool:{fn}", list(args), {}, timeout_s, pool=pool)


def wait_until(predicate: Any, what: str) -> None:
    for _ in range(3000):  # bounded: at most a minute
        if predicate():
            return
        time.sleep(0.02)
    pytest.fail(f"gave up waiting for {what}")


def test_state_one_invocation_leaves_is_there_for_the_next(pool: Pool) -> None:
    first, second = run(pool, "remember", 1), run(pool, "remember", 2)
    assert first.result["seen"] == [1]
    assert second.result == {"pid": first.result["pid"], "seen": [1, 2]}
    assert pool.started == 1


def test_the_set_up_hook_runs_once_per_child(pool: Pool) -> None:
    results = [run(pool, "predict", x).result for x in range(3)]
    assert [r["y"] for r in results] == [0, 2, 4]
    assert {r["setups"] for r in results} == {1}
    assert len({r["pid"] for r in results}) == 1


def test_a_set_up_that_raises_fails_the_invocation_it_holds_up_and_is_tried_again(
    pool: Pool,
) -> None:
    failed = run(pool, "after_flaky_setup")
    assert (failed.ok, failed.retry, failed.error["type"]) == (False, True, "RuntimeError")
    assert failed.error["message"] == (
        "set-up tests.udfs_pool:flaky_setup failed: the GPU is not ready yet"
    )
    assert "flaky_setup" in failed.error["traceback"]
    again = run(pool, "after_flaky_setup")
    assert again.ok and again.result["setup_calls"] == 2


def test_preloaded_modules_are_imported_in_the_child_before_its_first_invocation() -> None:
    plain, preloading = make_pool(), make_pool(preload=["tests.udfs_preloaded"])
    try:
        assert run(plain, "preloaded").result is None
        assert run(preloading, "preloaded").result is True
    finally:
        plain.close()
        preloading.close()


def test_a_preload_that_fails_is_reported_on_the_invocation() -> None:
    pool = make_pool(preload=["tests.no_such_module"])
    try:
        outcome = run(pool, "pid")
    finally:
        pool.close()
    assert (outcome.ok, outcome.error["type"]) == (False, "ModuleNotFoundError")
    assert outcome.error["message"].startswith("--preload tests.no_such_module failed")


def test_a_child_that_aborts_fails_only_its_invocation_and_is_replaced(
    pool: Pool, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    waiter = ThreadPoolExecutor(1)
    try:
        patient = waiter.submit(run, pool, "wait_for_file", str(gate))
        wait_until(lambda: len(pool.children) == 1, "the first child")
        crashed = run(pool, "abort")  # a second child: the first one is busy
        assert (crashed.ok, crashed.error["type"]) == (False, "WorkerCrash")
        assert "died (exit code -6)" in crashed.error["message"]
        gate.touch()
        survivor = patient.result(timeout=60)
    finally:
        gate.touch()
        waiter.shutdown()
    assert survivor.ok
    replacement = run(pool, "pid")
    assert replacement.ok and pool.started == 2  # the idle survivor took it
    assert replacement.result == survivor.result


def test_a_child_that_exits_mid_invocation_fails_it_and_the_next_gets_a_new_child(
    pool: Pool,
) -> None:
    before = run(pool, "pid").result
    crashed = runner.run("tests.udfs:crash", [], {}, 30, pool=pool)
    assert crashed.error["type"] == "WorkerCrash"
    assert "exit code 3" in crashed.error["message"]
    after = run(pool, "pid").result
    assert after != before and pool.started == 2


def test_a_timed_out_child_is_killed_and_replaced(pool: Pool, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    args = [str(pid_file), 60]
    outcome = runner.run("tests.udfs:pid_then_sleep", args, {}, 0.5, pool=pool)
    assert outcome.error["type"] == "TimeoutError"
    assert _gone_soon(int(pid_file.read_text()))
    assert run(pool, "pid").result != int(pid_file.read_text())


def test_set_up_time_is_not_counted_in_the_timeout(tmp_path: Path) -> None:
    """The preload takes its time; the invocation's short timeout starts after it."""
    pool = make_pool(preload=["tests.udfs_heavy"])
    try:
        assert run(pool, "pid", timeout_s=5.0).ok
    finally:
        pool.close()


def test_a_child_is_recycled_after_max_invocations() -> None:
    pool = make_pool(max_invocations_per_child=2)
    try:
        pids = [run(pool, "pid").result for _ in range(5)]
    finally:
        pool.close()
    assert pids[0] == pids[1] != pids[2] == pids[3] != pids[4]
    assert pool.started == 3


def test_a_child_is_recycled_after_an_invocation_that_leaves_it_over_max_memory() -> None:
    pool = make_pool(max_memory_per_child_mb=1)  # any Python process holds more
    try:
        pids = [run(pool, "pid").result for _ in range(3)]
    finally:
        pool.close()
    assert len(set(pids)) == 3


def test_what_a_udf_left_running_ends_with_its_invocation_while_the_child_stays(
    pool: Pool, tmp_path: Path
) -> None:
    path = tmp_path / "p"
    outcome = runner.run("tests.udfs_burst:spawn_then_wait", [str(path), 0], {}, 30, pool=pool)
    assert outcome.ok
    child, grandchild = _pids(path)
    assert _gone_soon(grandchild)
    assert pool.children == [child]


def test_a_stopped_invocation_takes_its_child_and_the_next_gets_a_new_one(pool: Pool) -> None:
    stopping = runner.Run("tests.udfs:sleep", [60], {}, None, pool=pool)
    stopping.start()
    stopping.kill()
    assert stopping.wait().error["type"] == "Stopped"
    assert run(pool, "pid").ok and pool.started == 2


# --- a warm pool ------------------------------------------------------------------------


def test_a_warm_pool_starts_its_children_before_any_work_and_uses_them() -> None:
    pool = Pool()
    try:
        pool.warm(2)
        assert pool.started == 2 and len(pool.children) == 2
        pids = {run(pool, "pid").result for _ in range(3)}
        assert pids <= set(pool.children) and pool.started == 2
    finally:
        pool.close()


def test_a_warm_child_that_dies_is_replaced_ahead_of_the_next_invocation() -> None:
    pool = Pool()
    try:
        pool.warm(2)
        first = pool.children
        os.kill(first[0], signal.SIGKILL)
        wait_until(lambda: first[0] not in pool.children and len(pool.children) == 2, "a new child")
        assert pool.started == 3
        assert run(pool, "pid").ok and pool.started == 3
    finally:
        pool.close()


async def test_warmed_waits_until_every_child_has_started_up() -> None:
    pool = Pool(loop=asyncio.get_running_loop())
    try:
        pool.warm(2)
        assert await pool.warmed(60.0)
        outcome = await runner.Run("tests.udfs_pool:pid", [], {}, 30.0, pool=pool).run()
        assert outcome.result in pool.children and pool.started == 2
    finally:
        await asyncio.to_thread(pool.close)


def test_a_daemon_warms_one_child_per_slot_or_as_few_as_hold_its_async_capacity() -> None:
    assert worker._warm_children(8, PoolConfig()) == 8
    assert worker._warm_children(64, PoolConfig(async_concurrency=16)) == 4
    assert worker._warm_children(5, PoolConfig(async_concurrency=2)) == 3


# --- async def ---------------------------------------------------------------------------


def test_an_async_def_udf_returns_its_result(pool: Pool) -> None:
    assert run(pool, "async_square", 7).result == 49


def test_an_async_generator_streams_its_items() -> None:
    items: list[Any] = []
    pool = Pool()
    try:
        outcome = runner.run("tests.udfs_pool:async_count", [3], {}, 30, items.append, pool)
    finally:
        pool.close()
    assert (outcome.ok, outcome.result, items) == (True, None, [0, 1, 2])


def test_async_errors_and_results_that_are_not_json_fail_as_plain_ones_do(pool: Pool) -> None:
    boom = run(pool, "async_boom")
    assert (boom.error["type"], boom.error["message"], boom.retry) == (
        "ValueError",
        "async boom",
        True,
    )
    not_json = run(pool, "async_not_json")
    assert (not_json.error["type"], not_json.retry) == ("TypeError", False)


def test_an_async_udf_past_its_timeout_is_cancelled_and_its_child_kept(pool: Pool) -> None:
    warm = run(pool, "pid").result
    outcome = run(pool, "async_sleep", 60, timeout_s=0.5)
    assert (outcome.ok, outcome.error["type"]) == (False, "TimeoutError")
    assert run(pool, "pid").result == warm and pool.started == 1


def test_a_stopped_async_udf_is_cancelled_in_its_child(pool: Pool, tmp_path: Path) -> None:
    items: list[Any] = []
    gate = tmp_path / "never"
    stopping = runner.Run("tests.udfs_pool:async_gated", [str(gate)], {}, None, items.append, pool)
    stopping.start()
    waiter = ThreadPoolExecutor(1)
    outcome = waiter.submit(stopping.wait)  # hands the items on as they come
    wait_until(lambda: items == [0], "the first item")
    stopping.kill()
    assert outcome.result(timeout=60).error["type"] == "Stopped"
    waiter.shutdown()
    assert pool.started == 1 and len(pool.children) == 1


def test_a_child_runs_async_invocations_together_up_to_its_concurrency() -> None:
    pool = make_pool(async_concurrency=3)
    try:
        # the pool learns that a function is async from its first run: until then it
        # gives each invocation a child of its own
        assert run(pool, "together", "alone", 1).ok
        waiter = ThreadPoolExecutor(3)
        futures = [waiter.submit(run, pool, "together", "g", 3) for _ in range(3)]
        outcomes = [f.result(timeout=60) for f in futures]
        waiter.shutdown()
    finally:
        pool.close()
    assert all(o.ok for o in outcomes), ([o.error for o in outcomes], pool.started)
    assert len({o.result for o in outcomes}) == 1 and pool.started == 1


def test_an_async_udf_that_blocks_its_loop_past_its_timeout_has_its_child_killed() -> None:
    """It cannot be cancelled; once it has not given way, its child goes, and the other
    invocation in that child fails as in a crash (and would be retried)."""
    pool = make_pool(async_concurrency=2)
    try:
        # the pool learns both are async, so they share the child
        assert run(pool, "blocks_its_loop", 0).ok and run(pool, "async_sleep", 0).ok
        waiter = ThreadPoolExecutor(1)
        beside = waiter.submit(run, pool, "async_sleep", 60, timeout_s=None)
        wait_until(lambda: len(pool.children) == 1, "the child")
        blocked = run(pool, "blocks_its_loop", 60, timeout_s=0.5)
        other = beside.result(timeout=60)
        waiter.shutdown()
    finally:
        pool.close()
    assert pool.started == 1
    assert (blocked.ok, blocked.error["type"]) == (False, "TimeoutError")
    assert (other.ok, other.retry, other.error["type"]) == (False, True, "WorkerCrash")
    assert "did not give way" in other.error["message"]


# --- waited for on the event loop ---------------------------------------------------------


async def test_an_invocation_waited_for_on_the_loop_times_out_and_the_next_gets_a_new_child() -> (
    None
):
    pool = Pool(loop=asyncio.get_running_loop())
    try:
        outcome = await runner.Run("tests.udfs:sleep", [60], {}, 0.5, pool=pool).run()
        assert outcome.error["type"] == "TimeoutError"
        after = await runner.Run("tests.udfs_pool:pid", [], {}, 30.0, pool=pool).run()
        assert after.ok and pool.started == 2
    finally:
        await asyncio.to_thread(pool.close)


async def test_an_invocation_on_the_loop_is_stopped_by_a_kill_from_another_thread() -> None:
    pool = Pool(loop=asyncio.get_running_loop())
    try:
        run_ = runner.Run("tests.udfs:sleep", [60], {}, None, pool=pool)
        outcome = run_.begin()
        await asyncio.to_thread(run_.kill)
        assert (await outcome).error["type"] == "Stopped"
    finally:
        await asyncio.to_thread(pool.close)


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
