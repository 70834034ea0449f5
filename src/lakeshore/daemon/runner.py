"""The process runner: each invocation in a pool child, so a crash or a hang stays contained.

:class:`Processes` is the daemon's :class:`~.runners.Runner` over a warm
:class:`~.pool.Pool`; each :class:`Run` sends one invocation to a child and waits, on
the pool's event loop, for its outcome: a generator's items are handed to ``on_item`` as
they come, and the whole run is bounded by ``timeout_s`` (set-up — preloads and
``@udf(setup=...)`` hooks — is not counted). Exceptions, import errors, results or items
that are not JSON and children that die are all reported as an :class:`Outcome`;
nothing raises.

A plain invocation that runs past its time-out, or whose lease is lost, is ended by
killing its child (and the child's process group: whatever the UDF started); the pool
starts another for the next invocation. An ``async def`` invocation shares its child with
others, so it is cancelled inside the child instead (its own ``asyncio.timeout``, or a
``cancel`` message); only a child that does not give way within :data:`GIVE_WAY_S` is
killed, and the other invocations it ran fail as a crash would (and are retried).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.machinery
import importlib.util
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from lakeshore import jsontext
from lakeshore.daemon.pool import Pool, PoolConfig, Ticket
from lakeshore.daemon.runners import Begun, Invocation, OnItem, awaited
from lakeshore.daemon.sentinel import Sentinel

GIVE_WAY_S = 5.0  # how long an async invocation has to end once cancelled or timed out
START_S = 60.0  # how long a child may take to begin an invocation (start, import lakeshore)
BURIAL_S = 10.0  # how long to wait for a killed child's group to be reaped


@dataclass(frozen=True)
class Outcome:
    ok: bool
    text: str = "null"  # the result, as the JSON text written where it ran
    error: dict[str, Any] = field(default_factory=dict)
    retry: bool = True

    @property
    def result(self) -> Any:
        """The result's value (the daemon itself passes :attr:`text` on, undecoded)."""
        return jsontext.parsed(self.text.encode())


def check_preload(module: str) -> None:
    """Refuse a ``--preload`` name that is not a module name or cannot be found, without
    importing it: the daemon never runs user code, each pool child imports it at start."""
    if (
        not module
        or module.startswith(".")
        or not all(part.isidentifier() for part in module.split("."))
    ):
        raise ValueError(f"{module!r} is not a module name (e.g. mypackage.models)")
    parts = module.split(".")
    spec = importlib.util.find_spec(parts[0])  # a top-level name is found, not imported
    for depth in range(1, len(parts)):
        locations = spec.submodule_search_locations if spec is not None else None
        if locations is None:
            spec = None
            break
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: depth + 1]), locations)
    if spec is None:
        raise ModuleNotFoundError(f"No module named {module!r}")


class Processes:
    """The process runner (:class:`~.runners.Runner`): invocations in the children of a
    warm pool, read on the event loop it is made on (the daemon's)."""

    def __init__(
        self,
        config: PoolConfig | None = None,
        sentinel: Sentinel | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.pool = Pool(config, sentinel, loop)

    def warm(self, capacity: int) -> None:
        self.pool.warm(warm_children(capacity, self.pool.config))

    async def run(self, invocation: Invocation, on_item: OnItem | None = None) -> Outcome:
        run = Run(self.pool, invocation, on_item)
        return await awaited(run.begin(), run)

    async def close(self) -> None:
        if not self.pool.closed:
            await asyncio.to_thread(self.pool.close)


def warm_children(capacity: int, config: PoolConfig) -> int:
    """Children started ahead of work: one per slot, or as few as hold ``capacity``
    ``async def`` invocations when a child may run several."""
    return -(-capacity // max(1, config.async_concurrency))


class Run(Begun):
    """One invocation in a pool child: ``begin`` sends it and hands back the future of its
    outcome; ``kill`` ends it early, from any thread (a lease that was lost, a daemon
    stopping), so nothing keeps running for an invocation this daemon no longer holds."""

    def __init__(self, pool: Pool, invocation: Invocation, on_item: OnItem | None = None) -> None:
        self.pool, self.invocation, self.on_item = pool, invocation, on_item
        self.fn, self.timeout_s = invocation.fn, invocation.timeout_s
        self._ticket: Ticket | None = None
        self._killed = False

    def kill(self) -> None:
        self._killed = True
        if self._ticket is not None:
            self._ticket.tell(("kill", self._ticket.id))  # the waiter acts on it

    def begin(self) -> asyncio.Future[Outcome]:
        """Start on the pool's event loop (the running one); the future of its outcome.
        Each message of its child is handed straight to the waiter, and a timer of the
        loop stands for its time-out: no thread, no task and no queue take part in the
        invocation (``kill`` still works from any thread)."""
        loop = asyncio.get_running_loop()
        self._waiting = done = loop.create_future()
        here = threading.get_ident()
        timer: list[asyncio.TimerHandle] = []  # the one pending, if any

        def step(message: tuple[Any, ...] | None) -> None:
            if self.outcome is None:
                settle(waiter._step(message))

        def settle(ended: Outcome | None) -> None:
            if timer:
                timer.pop().cancel()
            if ended is not None:
                self._resolve(ended)
                return
            wait_s = waiter._next_s()
            if wait_s is not None:
                timer.append(loop.call_later(wait_s, step, None))

        def post(message: tuple[Any, ...]) -> None:
            if threading.get_ident() == here:  # the pool reads its children on this loop
                step(message)
                return
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(step, message)

        self._ticket = self.pool.submit(self.invocation, post)
        waiter = _Waiter(self, self._ticket)
        settle(None)  # the timer of its start, or of its time-out
        if self._killed:
            self.kill()
        return done


class _Waiter:
    """What one run's wait knows: the time left, and whether it has ended the run."""

    def __init__(self, run: Run, ticket: Ticket) -> None:
        self.run, self.ticket = run, ticket
        # the clock starts as the child begins (a new child takes a moment to start)
        self.deadline: float | None = None
        self.paused: float | None = run.timeout_s  # time left while it waits or sets up
        self.ending: str | None = None  # "timeout" or "stopped", once decided
        # until then a child must have begun, an async run ended, a killed child be gone
        self.give_way: float | None = time.monotonic() + START_S
        self.began = False
        if ticket.warm:  # a child that ran it before takes it up at once, and says nothing
            self._clock("begin")
        self.killing = False  # its child has been killed

    def _step(self, message: tuple[Any, ...] | None) -> Outcome | None:
        """A message, or (None) the wait for one ran out: the outcome once there is one."""
        return self._expired() if message is None else self._take(message)

    def _take(self, message: tuple[Any, ...]) -> Outcome | None:
        kind = message[0]
        if kind == "item":
            if self.run.on_item is not None:
                self.run.on_item(jsontext.parsed(message[2].encode()))
        elif kind in ("begin", "pause", "resume"):
            self._clock(kind)
        elif kind == "kill":
            self._end("stopped")
        elif kind == "done":
            return self._done(message[2], message[3])
        elif kind == "died":
            return self._died()
        return None

    def _clock(self, kind: str) -> None:
        """The time-out runs from ``begin``, and stands still between ``pause`` (set-up)
        and ``resume``."""
        now = time.monotonic()
        if kind == "begin":
            self.began = True
            if self.ending is None:
                self.give_way = None
        if kind == "pause" and self.deadline is not None:
            self.paused, self.deadline = self.deadline - now, None
        elif kind != "pause" and self.paused is not None:
            self.deadline, self.paused = now + self.paused, None

    def _next_s(self) -> float | None:
        times = [t for t in (self.deadline, self.give_way) if t is not None]
        return max(0.0, min(times) - time.monotonic()) if times else None

    def _expired(self) -> Outcome | None:
        now = time.monotonic()
        if self.give_way is not None and now >= self.give_way:
            self.give_way = None
            if self.killing:  # killed, and still not reaped: do not wait for ever
                return self._died()
            self.killing = True
            why = "did not give way" if self.began else f"did not start within {START_S:.0f} s"
            self.run.pool.kill(self.ticket.child, f"{self.run.fn}: its child {why}")
            self.give_way = now + BURIAL_S
        elif self.deadline is not None and now >= self.deadline:
            self.deadline = None
            self._end("timeout")
        return None

    def _end(self, why: str) -> None:
        """Time-out or stop: cancel an async run in its child, kill a plain one's child."""
        if self.ending is not None:
            return
        self.ending = why
        if self.ticket.kind == "async":
            self.run.pool.cancel(self.ticket)
            self.give_way = time.monotonic() + GIVE_WAY_S
        else:
            self.killing = True
            said = "past its timeout" if why == "timeout" else "stopped"
            self.run.pool.kill(self.ticket.child, f"{self.run.fn} ran {said}")
            self.give_way = time.monotonic() + BURIAL_S  # for the "died" to come

    def _done(self, kind: str, payload: Any) -> Outcome:
        if kind not in ("ok", "error") and self.ending == "timeout":
            kind = "timeout"
        return outcome_of(self.run.fn, self.run.timeout_s, kind, payload)

    def _died(self) -> Outcome:
        if self.ending == "timeout":
            return timed_out(self.run.fn, self.run.timeout_s)
        if self.ending == "stopped" or self.run._killed:
            return stopped(self.run.fn)
        child, fn = self.ticket.child, self.run.fn
        if child.killed_for is not None:
            message = f"the process running {fn} was killed: {child.killed_for}"
        else:
            message = f"the process running {fn} died (exit code {child.exitcode})"
        return Outcome(ok=False, error={"type": "WorkerCrash", "message": message})


def outcome_of(fn: str, timeout_s: float | None, kind: str, payload: Any) -> Outcome:
    """The outcome of a reply from :mod:`.calls` (``ok``, ``error``), or of a run that
    ended ``timeout`` or ``cancelled`` (stopped by the daemon)."""
    if kind == "ok":
        return Outcome(ok=True, text=payload)
    if kind == "error":
        retry = bool(payload.pop("retry", True))
        return Outcome(ok=False, error=payload, retry=retry)
    if kind == "timeout":
        return timed_out(fn, timeout_s)
    return stopped(fn)


def timed_out(fn: str, timeout_s: float | None) -> Outcome:
    message = f"{fn} ran past its timeout of {timeout_s} s"
    return Outcome(ok=False, error={"type": "TimeoutError", "message": message})


def stopped(fn: str) -> Outcome:
    message = f"{fn} was stopped by the daemon (its lease was lost, or the daemon stopped)"
    return Outcome(ok=False, error={"type": "Stopped", "message": message})
