"""The daemon's slots in turns by concurrency key: who starts next when a slot frees."""

from __future__ import annotations

import asyncio

import pytest

from lakeshore.daemon.turns import Turns


async def _waiting(turns: Turns, started: list[str], name: str, key: str | None) -> None:
    await turns.acquire(key)
    started.append(name)


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.mark.parametrize(
    ("held", "order"),
    [
        # a flood of a's held first, then one b: b starts second, not last
        ([("a1", "a"), ("a2", "a"), ("a3", "a"), ("b1", "b")], ["a1", "b1", "a2", "a3"]),
        # no keys: first come, first served
        ([("x1", None), ("x2", None), ("x3", None)], ["x1", "x2", "x3"]),
        # three keys take turns, each in its own order; no key is a key of its own
        (
            [("a1", "a"), ("a2", "a"), ("n1", None), ("b1", "b"), ("b2", "b"), ("n2", None)],
            ["a1", "n1", "b1", "a2", "n2", "b2"],
        ),
    ],
)
async def test_a_freed_slot_goes_to_the_next_key_in_turn(
    held: list[tuple[str, str | None]], order: list[str]
) -> None:
    turns = Turns(capacity=0)  # every one waits; slots are freed one at a time
    started: list[str] = []
    tasks = [asyncio.create_task(_waiting(turns, started, n, k)) for n, k in held]
    await _settle()
    for _ in held:
        turns.release()
        await _settle()
    assert started == order
    await asyncio.gather(*tasks)


async def test_free_slots_are_taken_at_once_and_given_back() -> None:
    turns = Turns(capacity=2)
    await turns.acquire("a")
    await turns.acquire("b")
    assert turns.free == 0
    turns.release()
    assert turns.free == 1


async def test_a_cancelled_wait_takes_no_slot_and_loses_none() -> None:
    turns = Turns(capacity=0)
    started: list[str] = []
    gone = asyncio.create_task(_waiting(turns, started, "a1", "a"))
    kept = asyncio.create_task(_waiting(turns, started, "b1", "b"))
    await _settle()
    gone.cancel()
    await _settle()
    turns.release()
    await _settle()
    assert started == ["b1"]
    await kept
    # a wait cancelled just as it was handed its slot gives the slot on
    late = asyncio.create_task(_waiting(turns, started, "c1", "c"))
    after = asyncio.create_task(_waiting(turns, started, "d1", "d"))
    await _settle()
    turns.release()  # hands c1's future its slot…
    late.cancel()  # …and the cancel arrives before c1 runs
    await _settle()
    assert started == ["b1", "d1"]
    await after
    assert turns.free == 0
