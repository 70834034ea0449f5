"""A daemon's background tasks end even when one absorbs a cancellation."""

from __future__ import annotations

import asyncio

from lakeshore.daemon.worker import _cancelled


async def test_a_task_that_absorbs_a_cancellation_is_cancelled_again() -> None:
    absorbed = 0

    async def stubborn() -> None:
        nonlocal absorbed
        while True:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                absorbed += 1
                if absorbed > 1:
                    raise
                asyncio.current_task().uncancel()  # type: ignore[union-attr]

    task = asyncio.create_task(stubborn(), name="stubborn")
    await asyncio.sleep(0)
    async with asyncio.timeout(10):
        await _cancelled(task, every_s=0.001)
    assert task.cancelled()
    assert absorbed == 2
