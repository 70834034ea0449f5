"""What the daemon runs an invocation with: one :class:`Runner`, chosen as it starts.

Two runners implement it: :class:`.runner.Processes` (a warm pool of child processes, the
default) and :class:`.threads.Threads` (the daemon's own threads, ``--runner thread``).
The daemon hands either an :class:`Invocation` and awaits its :class:`.runner.Outcome`;
it never asks which one it holds.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from lakeshore.daemon.runner import Outcome

T = TypeVar("T")

OnItem = Callable[[Any], None]  # a generator's item, decoded (called from any thread)


@dataclass(frozen=True, slots=True)
class Invocation:
    """One invocation as a claim's answer gives it, made once and passed down whole."""

    id: str
    fn: str  # "module:qualname"
    args: list[Any]
    kwargs: dict[str, Any]
    timeout_s: float | None  # from when it begins; set-up is not counted
    concurrency_key: str | None = None  # the key its queue takes turns by, if any

    @classmethod
    def of(cls, claimed: dict[str, Any]) -> Invocation:
        """From one entry of a claim's (or a report's) ``invocations``."""
        return cls(
            claimed["id"],
            claimed["fn"],
            claimed["args"],
            claimed["kwargs"],
            claimed["timeout_s"],
            claimed.get("concurrency_key"),
        )


class Runner(Protocol):
    """Runs invocations; the daemon holds one from start to exit."""

    def warm(self, capacity: int) -> None:
        """Get ready to run ``capacity`` invocations at once (the process runner starts
        its children), ahead of the first claim; it does not wait."""

    async def run(self, invocation: Invocation, on_item: OnItem | None = None) -> Outcome:
        """Run it to its outcome, handing a generator's items to ``on_item`` as they
        come; what it raises, times out or crashes is an outcome, nothing raises. A
        cancel (a lost lease, a daemon stopping) stops the run, and the cancel goes on
        only once the run has ended, so its slot is held until then."""
        ...

    async def close(self) -> None:
        """Stop what it keeps (children, threads) once nothing runs; again is nothing."""


class Begun:
    """A run begun (in a child, or on a thread): its outcome, once it has ended, and the
    future it is handed to; ``stop`` kills it once that future was given up."""

    outcome: Outcome | None = None
    _waiting: asyncio.Future[Outcome] | None = None  # what is handed the outcome

    def kill(self) -> None:
        raise NotImplementedError

    def stop(self) -> asyncio.Future[Outcome]:
        """Kill it, the future ``begin`` gave given up; the future of its end."""
        self._waiting = ended = asyncio.get_running_loop().create_future()
        if self.outcome is not None:
            ended.set_result(self.outcome)
        else:
            self.kill()
        return ended

    def _resolve(self, outcome: Outcome) -> None:
        self.outcome, waiting = outcome, self._waiting
        if waiting is not None and not waiting.done():  # not given up
            waiting.set_result(outcome)


async def awaited(done: asyncio.Future[Outcome], run: Begun) -> Outcome:
    """A run's outcome. Cancelled meanwhile (a lost lease, a daemon stopping), the run is
    stopped and the cancel goes on once it has ended, so it holds its slot until then.
    ``done`` is awaited as it is (a cancel cancels it, and the run is asked for another
    future): no ``asyncio.shield``, a second future and two callbacks per invocation."""
    try:
        return await done
    except asyncio.CancelledError:
        if done.cancelled():  # it was running: stop it, and wait until it has ended
            with contextlib.suppress(asyncio.CancelledError):  # a second cancel: go
                await run.stop()
        raise


async def until_ended(done: asyncio.Future[T], stop: Callable[[], None]) -> T:
    """Await ``done``; cancelled meanwhile, ``stop`` the run and wait until it has ended
    (``done`` settles either way) before the cancel goes on."""
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        stop()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.shield(done)
        raise
