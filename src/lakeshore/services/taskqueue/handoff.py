"""A submit handed straight to a claim waiting in this server.

An idle worker's claim waits (a long-poll) for a submit to one of its queues. Woken, it
would begin a transaction, touch its worker, read its queues, lease, and commit: three
round trips after the submit's own, between a submit and its start. Instead, a single
submit to a queue this server knows (``services.invocations._submit_to_known``) takes
the longest-waiting claim on that queue, when the worker's token may claim there, and
writes the invocation already leased to that worker, in its one statement, when the
worker may take it at that moment as a claim would (``store.invocations.
insert_one_handed``); the waiting claim then answers with it. When the statement finds
otherwise, the invocation goes in pending and every waiting claim is woken as usual.

Only claims waiting on this server's event loop are handed anything: other replicas'
claims are woken through ``LISTEN/NOTIFY`` as before. A claim whose client has hung up
is passed over. The claim's answer, which starts the work, goes out before the
submitter's (:meth:`Waiting.answer_first`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from lakeshore.domain import access
from lakeshore.services.taskqueue.notify import Hangup

Claimed = list[dict[str, Any]]
TURNS = 4  # a waiting claim resumes in one turn of the loop; one still waking, in three


@dataclass(eq=False)
class Waiter:
    """A claim waiting on its worker's own queues that dispatch."""

    worker_id: str
    holds: int  # the most invocations the worker may hold at once
    caller: access.Caller | None
    lease_s: float
    gone: Hangup | None = None  # its client hung up
    woken: asyncio.Event = field(default_factory=asyncio.Event)
    queue_ids: list[str] = field(default_factory=list)  # where it waits
    handed: asyncio.Future[Claimed] | None = None  # set once a submit took it
    taken: bool = False  # it has received what was handed: its answer is on its way

    async def received(self) -> Claimed:
        """What a submit handed it (nothing when it was not taken, or the invocation
        went in pending)."""
        claimed = [] if self.handed is None else await self.handed
        self.taken = bool(claimed)
        return claimed


class Waiting:
    """The claims waiting in this server, by queue, longest-waiting first."""

    def __init__(self) -> None:
        self._by_queue: dict[str, dict[Waiter, None]] = {}

    @contextmanager
    def wait(self, waiter: Waiter, queue_ids: Iterable[str]) -> Iterator[Waiter]:
        waiter.queue_ids = list(queue_ids)
        for key in waiter.queue_ids:
            self._by_queue.setdefault(key, {})[waiter] = None
        try:
            yield waiter
        finally:
            self._drop(waiter)

    def _drop(self, waiter: Waiter) -> None:
        for key in waiter.queue_ids:
            waiters = self._by_queue.get(key)
            if waiters is not None:
                waiters.pop(waiter, None)
                if not waiters:
                    del self._by_queue[key]

    def on(self, queue_id: str) -> int:
        """How many claims wait on ``queue_id`` now."""
        return len(self._by_queue.get(queue_id, ()))

    def take(self, queue_id: str, queue_name: str, policy: Any) -> Waiter | None:
        """The longest-waiting claim on ``queue_id`` whose worker's token may claim
        there under ``policy`` (the queue's ``authPolicy``), no longer waiting for
        anyone else: the caller must :meth:`settle` it."""
        for waiter in list(self._by_queue.get(queue_id, ())):
            if waiter.gone is not None and waiter.gone.is_set():
                continue
            if waiter.caller is not None and access.refusal(
                policy, "claim", waiter.caller, queue_name
            ):
                continue
            self._drop(waiter)
            waiter.handed = asyncio.get_running_loop().create_future()
            waiter.woken.set()
            return waiter
        return None

    @staticmethod
    def settle(waiter: Waiter, claimed: Claimed) -> None:
        """Hand ``claimed`` (empty: nothing) to a claim :meth:`take` returned."""
        if waiter.handed is not None and not waiter.handed.done():
            waiter.handed.set_result(claimed)

    @staticmethod
    async def answer_first(waiter: Waiter, turns: int = TURNS) -> None:
        """Give the event loop to a claim that was handed an invocation until it has
        received it, at most ``turns`` turns of the loop: its answer, which starts the
        work, then goes out before the submitter's (the claim's route writes it in the
        same turn). A claim waiting on its handed future takes one turn; one cancelled
        meanwhile is not waited for past ``turns``."""
        for _ in range(turns):
            if waiter.taken:
                return
            await asyncio.sleep(0)
