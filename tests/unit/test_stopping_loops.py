"""Shutdown stops a background loop between two of its steps, never in one."""

from __future__ import annotations

import asyncio

import pytest

from lakeshore.api import app as app_module


async def _loop(
    working: asyncio.Lock, entered: asyncio.Event, go_on: asyncio.Event, log: list[str]
) -> None:
    while True:
        async with working:
            entered.set()
            log.append("step begins")
            await go_on.wait()  # a transaction under way
            log.append("step ends")
        await asyncio.sleep(3600)


async def test_a_step_under_way_ends_before_its_loop_is_cancelled() -> None:
    working, entered, go_on, log = asyncio.Lock(), asyncio.Event(), asyncio.Event(), []
    task = asyncio.create_task(_loop(working, entered, go_on, log))
    await entered.wait()
    stopping = asyncio.create_task(app_module._stop_between_steps(task, working))
    await asyncio.sleep(0)
    assert not task.cancelled() and not stopping.done()  # waiting for the step
    go_on.set()
    await stopping
    assert task.cancelled()
    assert log == ["step begins", "step ends"]
    assert not working.locked()


async def test_a_step_that_outlasts_the_wait_is_cancelled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(app_module, "STOP_WAIT_S", 0.0)
    working, entered, never, log = asyncio.Lock(), asyncio.Event(), asyncio.Event(), []
    task = asyncio.create_task(_loop(working, entered, never, log))
    await entered.wait()
    await app_module._stop_between_steps(task, working)
    assert task.cancelled()
    assert log == ["step begins"]


async def test_a_loop_without_steps_is_cancelled_at_once() -> None:
    task = asyncio.create_task(asyncio.sleep(3600))
    await app_module._stop_between_steps(task, None)
    assert task.cancelled()
