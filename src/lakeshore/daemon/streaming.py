"""Sending a generator invocation's items to the server while it runs.

Items arrive from the runner (``put`` is thread-safe) and go out in order, as
many per request as have piled up, numbered from 0 so that a retried post stores nothing
twice. The invocation's own report waits for ``close``, so every item is stored before
the final state. A refused item (too large, not storable) stops the stream and becomes
the invocation's error; a lost lease stops it quietly (the report will be refused too).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from lakeshore import backoff, jsontext, refusals, transport

log = logging.getLogger("lakeshore.daemon")

MAX_ITEMS_PER_POST = 500
ATTEMPTS = 30  # tries of one post while the server is away
_JSON = {"Content-Type": "application/json"}
_END = object()


class ItemSender:
    def __init__(self, http: transport.AsyncTransport, path: str) -> None:
        self.http = http
        self.path = path
        self.sent = 0
        self.error: dict[str, Any] | None = None
        self._lost = False
        self._queue: asyncio.Queue[Any] | None = None
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        # started by the first item: most invocations stream nothing
        self._task: asyncio.Task[None] | None = None

    def put(self, item: Any) -> None:
        """Queue an item (from any thread)."""
        if threading.get_ident() == self._thread:
            self._put(item)
        else:
            self._loop.call_soon_threadsafe(self._put, item)

    def _put(self, item: Any) -> None:
        if self._queue is None:
            self._queue = asyncio.Queue()
            self._task = self._loop.create_task(
                self._send_all(self._queue), name=f"stream {self.path}"
            )
        self._queue.put_nowait(item)

    async def close(self) -> None:
        """Send what is queued, then stop."""
        if self._queue is None or self._task is None:  # nothing was put: nothing to send
            return  # (items put from a thread come before its end is seen on the loop)
        self._queue.put_nowait(_END)
        await self._task

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _send_all(self, queue: asyncio.Queue[Any]) -> None:
        done = False
        while not done:
            batch = [await queue.get()]
            while not queue.empty() and len(batch) < MAX_ITEMS_PER_POST:
                batch.append(queue.get_nowait())
            if batch[-1] is _END:
                batch.pop()
                done = True
            if batch and self.error is None and not self._lost:
                await self._post_all(batch)

    async def _post_all(self, items: list[Any]) -> None:
        """One post for the batch; if it is refused, item by item, so every item before
        the refused one is still stored."""
        await self._post(items)
        refused = self.error is not None and self.error["type"] == "StreamItemRejected"
        if refused and len(items) > 1:
            self.error = None
            for item in items:
                await self._post([item])
                if self.error is not None or self._lost:
                    return

    async def _post(self, items: list[Any]) -> None:
        encoded = jsontext.encoded({"seq": self.sent, "items": items})  # big ints kept

        async def once() -> transport.Answer | None:
            try:
                return await self.http.request("POST", self.path, body=encoded, headers=_JSON)
            except transport.Unreachable as exc:
                log.warning("stream post failed (%s); retrying", exc)
                raise

        tries = backoff.aretrying(
            transport.Unreachable, tries=ATTEMPTS, first_s=0.2, max_s=5.0, give_up=lambda _: None
        )
        response: transport.Answer | None = await tries(once)
        if response is None:
            self.error = {"type": "StreamUnavailable", "message": "the server took no items"}
        elif response.is_success:
            self.sent += len(items)
        elif response.status_code in (404, 409, 410):
            self._lost = True
            log.warning("stream refused: %s", response.text[:200])
        else:
            self.error = {"type": "StreamItemRejected", "message": _message(response)}


def _message(response: transport.Answer) -> str:
    refusal = refusals.read(response.status_code, response.content)
    return refusal.message if refusal.enveloped else str(refusal)
