"""Reporting outcomes in batches, and claiming the freed slots again in the same request.

Invocations that end while a report is on its way wait, and go together in the next
``POST /v1/workers/{id}/results`` (at most ``MAX_ITEMS`` or about ``MAX_BYTES`` of JSON
each), which also leases up to as many new invocations as the batch frees: a busy daemon
makes about one round trip per batch instead of a complete and a claim per invocation.
Transport errors, 429 and 5xx are retried with back-off; an answer that never comes leaves
the invocations held, and the server hands them back once the daemon's heartbeats stop
listing them. Each caller learns its invocation's new state, or why it was refused.

Each outcome is encoded once, by orjson, as it is queued: its size decides the batches,
and a request's body is the encoded outcomes joined (Python's json module, at 10-20 µs an
outcome, was a tenth of a busy daemon's time; it still encodes what orjson cannot, such as
an integer over 64 bits).
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from lakeshore import backoff, jsontext, logs, refusals, transport

log = logging.getLogger("lakeshore.daemon")

MAX_ITEMS = 500
MAX_BYTES = 256 * 1024
ATTEMPTS = 30
UNDELIVERED = "undelivered"  # no answer after every attempt
NOT_HELD = "not_held"


@dataclass(frozen=True)
class Answer:
    """What became of a report: the invocation's new ``state`` (``succeeded``,
    ``pending``, ``failed``), or ``not_held``, ``too_large``, ``invalid`` or
    ``undelivered``, with the server's message where it gave one."""

    state: str
    message: str = ""


@dataclass
class _Pending:
    invocation_id: str
    encoded: bytes  # {"id": ..., **body} as JSON
    done: asyncio.Future[Answer] = field(repr=False)


class Reporter:
    """``report`` from any task of the daemon; ``run`` is the one task that sends."""

    def __init__(
        self,
        http: transport.AsyncTransport,
        path: Callable[[], str],
        *,
        free_after: Callable[[int], int],
        on_claimed: Callable[[list[dict[str, Any]]], None],
        retry_s: float = 0.2,
        on_trip: Callable[[float], None] | None = None,
    ) -> None:
        self.http = http
        self.path = path  # the worker's results route (its id may change on a new hello)
        self.free_after = free_after  # slots free once this many reports are done
        self.on_claimed = on_claimed
        self.retry_s = retry_s
        self.on_trip = on_trip  # told each answered report's round trip, in seconds
        self._waiting: collections.deque[_Pending] = collections.deque()
        self._ready = asyncio.Event()

    async def report(self, invocation_id: str, body: dict[str, Any]) -> Answer:
        """Queue one outcome (``{"result"}`` or ``{"error", "retry"}``) and wait for its
        :class:`Answer`."""
        return await self.report_encoded(invocation_id, encode({"id": invocation_id, **body}))

    async def report_result(self, invocation_id: str, result_json: str) -> Answer:
        """:meth:`report` of a success whose result is JSON text already (as a pool child
        wrote it): passed on as it is, not decoded and encoded again."""
        encoded = b'{"id":%b,"result":%b}' % (encode(invocation_id), result_json.encode())
        return await self.report_encoded(invocation_id, encoded)

    async def report_encoded(self, invocation_id: str, encoded: bytes) -> Answer:
        """:meth:`report` of an outcome encoded already (``{"id": ..., ...}`` as JSON)."""
        done: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._waiting.append(_Pending(invocation_id, encoded, done))
        self._ready.set()
        return await done

    async def run(self) -> None:
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self._waiting:
                batch = self._next_batch()
                try:
                    await self._send(batch)
                except Exception:  # an answer not understood must not stop every report
                    log.exception("reporting %d result(s) failed", len(batch))
                    self._settle(batch, {}, Answer(UNDELIVERED))
                # a turn of the loop for the runs this answer settled to end (their slots
                # free), so the next report's claim counts them
                await asyncio.sleep(0)

    def _next_batch(self) -> list[_Pending]:
        batch: list[_Pending] = []
        size = 0
        while self._waiting and len(batch) < MAX_ITEMS:
            item = self._waiting[0]
            if batch and size + len(item.encoded) > MAX_BYTES:
                break
            self._waiting.popleft()
            if not item.done.done():  # its task was cancelled meanwhile
                batch.append(item)
                size += len(item.encoded) + 1
        return batch

    async def _send(self, batch: list[_Pending]) -> None:
        if not batch:
            return
        response = await self._post(batch)
        if response is not None and response.status_code == 413 and len(batch) > 1:
            for item in batch:  # over the server's body cap together: one at a time
                await self._send([item])
            return
        if response is None or not response.is_success:
            self._settle(batch, {}, _refusal(response))
            return
        answer = jsontext.parsed(response.content)  # invocations to run, with their args
        if answer["invocations"]:
            self.on_claimed(answer["invocations"])
        outcomes: dict[str, Answer] = {}
        for r in answer["results"]:
            state = r.get("state") or r.get("refused", NOT_HELD)
            outcomes[r["id"]] = Answer(state, r.get("message", ""))
            if state == NOT_HELD:
                log.warning(
                    "result for %s refused: %s",
                    r["id"],
                    r.get("message", ""),
                    extra=logs.ids(invocation=r["id"]),
                )
        self._settle(batch, outcomes, Answer(NOT_HELD))

    async def _post(self, batch: list[_Pending]) -> transport.Answer | None:
        """The batch's answer, tried again (backing off) while the server is away or
        refuses for now; None once :data:`ATTEMPTS` tries had no answer."""
        results = b",".join(item.encoded for item in batch)
        claim = max(0, self.free_after(len(batch)))

        async def once() -> transport.Answer:
            nonlocal claim
            body = b'{"results":[%b],"claim":%d}' % (results, claim)
            began = asyncio.get_running_loop().time()
            try:
                response = await self.http.request("POST", self.path(), body=body, headers=_JSON)
            except transport.Unreachable as exc:
                log.warning("report failed (%s); retrying", exc)
                claim = 0  # a lost answer may have leased some already
                raise
            if _for_now(response):
                log.warning("report refused for now (%d); retrying", response.status_code)
                claim = 0
            elif self.on_trip is not None:
                self.on_trip(asyncio.get_running_loop().time() - began)
            return response

        tries = backoff.aretrying(
            transport.Unreachable,
            tries=ATTEMPTS,
            first_s=self.retry_s,
            max_s=5.0,
            again=_for_now,
            give_up=lambda _state: None,
        )
        answer: transport.Answer | None = await tries(once)
        if answer is None:
            log.error(
                "%d result(s) could not be delivered; the server will hand them back", len(batch)
            )
        return answer

    @staticmethod
    def _settle(batch: list[_Pending], outcomes: dict[str, Answer], default: Answer) -> None:
        for item in batch:
            if not item.done.done():
                item.done.set_result(outcomes.get(item.invocation_id, default))


_JSON = {"Content-Type": "application/json"}


def encode(value: Any) -> bytes:
    """JSON, by orjson where it can, else Python's json (an integer over 64 bits). No NaN
    comes here: a result was made JSON, NaN refused, where it ran (:mod:`.calls`)."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return json.dumps(value, allow_nan=False, separators=(",", ":")).encode()


def _for_now(response: transport.Answer) -> bool:
    """A refusal worth trying again: the server is overloaded or restarting."""
    return response.status_code == 429 or response.status_code >= 500


def _refusal(response: transport.Answer | None) -> Answer:
    """What a whole batch refused (or never answered) means for each of its items."""
    if response is None:
        return Answer(UNDELIVERED)
    message = refusals.read(response.status_code, response.content).message
    if response.status_code == 413:
        return Answer("too_large", message)
    if response.status_code in (404, 409, 410):  # the worker was dropped or retired
        return Answer(NOT_HELD, message)
    log.error("results refused (%d): %s", response.status_code, message)
    return Answer(UNDELIVERED, message)
