"""The SDK from an event loop: ``AsyncClient``, ``AsyncHandle`` and ``agather``.

    import lakeshore

    async with lakeshore.AsyncClient() as client:
        handle = await client.submit("gpu", "models.embed:embed", ["hello"])
        vector = await handle.result(timeout=60)
        async for token in (await client.submit("gpu", "models.llm:generate", ["hi"])).stream():
            ...
        cubes = await cube.amap(range(100))          # a @udf's calls, 1,000 to a request
        results = await lakeshore.agather(cubes, timeout=60)

It mirrors :class:`lakeshore.Client` method for method, over the asynchronous face of the
same transport (:mod:`lakeshore.transport`: one reading of proxies and certificates, the
error envelope decoded in one place), with the same request bodies and the same waits: a
handle's ``result`` is its invocation's end event, not a poll. A client belongs to the
event loop it is first used on.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Generic, TypeVar

from lakeshore import backoff, jsontext, transport
from lakeshore.fanin import taken
from lakeshore.sdk import (
    LAST_ITEM,
    RECONNECT_ON,
    STREAM_READ_S,
    STREAM_RECONNECTS,
    Place,
    Resumed,
    StreamEndedEarly,
    batches,
    namespace_path,
    outcome,
    read_bound,
    refused,
    settings,
    stream_refused,
    submit_body,
)

R = TypeVar("R")


class AsyncClient:
    """The server's API from asyncio: submit (one or many), read, cancel, follow.

    Takes ``LAKESHORE_URL``, ``LAKESHORE_TOKEN`` and ``LAKESHORE_NAMESPACE`` as
    :class:`lakeshore.Client` does; ``ca`` names a certificate file or directory to
    trust. Use it as an async context manager, or call :meth:`aclose`."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        namespace: str | None = None,
        *,
        timeout: float = 30.0,
        connections: int = 10,
        ca: str | None = None,
    ) -> None:
        self.url, self.namespace, auth = settings(url, token, namespace)
        self._http = transport.aconnect(
            self.url, headers=auth, read_s=timeout, size=connections, ca=ca
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    def _path(self, *segments: str) -> str:
        return namespace_path(self.namespace, *segments)

    async def request(
        self, method: str, path: str, *, json: Any = None, params: dict[str, Any] | None = None
    ) -> Any:
        """``method path`` with ``json`` as its body: the answer's JSON, or
        :class:`~lakeshore.sdk.LakeshoreClientError` with the server's words;
        ``ConnectionError`` when the server cannot be reached."""
        try:
            answer = await self._http.request(method, path, json=json, params=params)
        except transport.Unreachable as exc:
            raise ConnectionError(f"cannot reach the server at {self.url}: {exc}") from None
        if not answer.is_success:
            raise refused(answer.status_code, answer.content)
        return answer.json()  # an integer past 64 bits is read as one

    async def submit(
        self,
        queue: str,
        fn: str,
        args: list[Any] | tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        key: str | None = None,
        max_attempts: int | None = None,
        timeout_s: float | None = None,
        delay_s: float | None = None,
        not_before: datetime | None = None,
        retry: Mapping[str, Any] | None = None,
        concurrency_key: str | None = None,
    ) -> AsyncHandle[Any]:
        """Submit one call, as :meth:`lakeshore.Client.submit` does."""
        body = submit_body(
            fn,
            args,
            kwargs,
            key=key,
            max_attempts=max_attempts,
            timeout_s=timeout_s,
            delay_s=delay_s,
            not_before=not_before,
            retry=retry,
            concurrency_key=concurrency_key,
        )
        created = await self.request("POST", self._path("queues", queue, "invocations"), json=body)
        return AsyncHandle(self, created["id"])

    async def submit_many(
        self,
        queue: str,
        fn: str,
        args_list: Iterable[Sequence[Any]],
        kwargs_list: Iterable[dict[str, Any]] | None = None,
        *,
        max_attempts: int | None = None,
        timeout_s: float | None = None,
        retry: Mapping[str, Any] | None = None,
        concurrency_key: str | None = None,
    ) -> list[AsyncHandle[Any]]:
        """Submit ``fn`` once per item of ``args_list`` (``kwargs_list``'s item by item,
        when given), in order, 1,000 to a request, each request's batch stored whole or
        not at all; the handles in the calls' order."""
        path = self._path("queues", queue, "invocations", "batch") + "?answer=ids"
        handles: list[AsyncHandle[Any]] = []
        options: dict[str, Any] = {"max_attempts": max_attempts, "timeout_s": timeout_s}
        options.update(retry=retry, concurrency_key=concurrency_key)
        for batch in batches(fn, args_list, kwargs_list, **options):
            answer = await self.request("POST", path, json={"invocations": batch})
            handles.extend(AsyncHandle(self, item["id"]) for item in answer["invocations"])
        return handles

    async def get(self, invocation_id: str) -> dict[str, Any]:
        return dict(await self.request("GET", self._path("invocations", invocation_id)))

    async def cancel(self, invocation_id: str) -> dict[str, Any]:
        path = self._path("invocations", invocation_id, "cancel")
        return dict(await self.request("POST", path))

    async def ended(
        self,
        invocation_id: str,
        timeout: float | None = None,  # noqa: ASYNC109 - the blocking Client's, mirrored
    ) -> dict[str, Any]:
        """The invocation once it has ended, read from its stream's ``end`` event;
        ``TimeoutError`` once ``timeout`` seconds have gone by."""
        path = self._path("invocations", invocation_id, "stream")
        deadline = None if timeout is None else time.monotonic() + timeout
        tries = backoff.aretrying(RECONNECT_ON, tries=STREAM_RECONNECTS + 1)
        return await tries(self._wait_end, path, deadline, invocation_id, timeout)

    async def _wait_end(
        self, path: str, deadline: float | None, invocation_id: str, asked_s: float | None
    ) -> dict[str, Any]:
        while True:
            read = read_bound(deadline, invocation_id, asked_s)
            try:
                return await self._end_of(path, read)
            except transport.TimedOut:
                continue  # no word within the read's time: the deadline decides

    async def _end_of(self, path: str, read_s: float) -> dict[str, Any]:
        try:
            async with self._http.events(
                path, params={"after": LAST_ITEM}, read_s=read_s
            ) as events:
                async for event in events:
                    if event.event == "end":
                        return dict(jsontext.parsed(event.data.encode()))
        except transport.Refused as exc:
            raise stream_refused(exc.answer) from None
        raise StreamEndedEarly(f"the stream of {path} ended before the invocation did")

    async def follow(
        self, invocation_id: str, *, after: int = -1, reconnects: int = STREAM_RECONNECTS
    ) -> AsyncIterator[tuple[str, Any]]:
        """The invocation's stream: ``("item", value)`` for each item as it arrives, then
        ``("end", invocation)``. A dropped connection is resumed where it left off, as
        :meth:`lakeshore.Client.follow` resumes it."""
        path = self._path("invocations", invocation_id, "stream")
        place = Place(after)
        while True:
            try:
                async for attempt in backoff.aretrying(RECONNECT_ON, tries=reconnects + 1):
                    with attempt:
                        async for kind_value in self._follow_once(path, place):
                            yield kind_value
                        return
            except Resumed:
                continue

    async def _follow_once(self, path: str, place: Place) -> AsyncIterator[tuple[str, Any]]:
        place.moved = False
        try:
            async with self._http.events(
                path, params={"after": place.after}, read_s=STREAM_READ_S
            ) as events:
                async for event in events:
                    if event.event == "item":
                        place.after, place.moved = int(event.id), True
                        yield "item", jsontext.parsed(event.data.encode())
                    elif event.event == "end":
                        yield "end", jsontext.parsed(event.data.encode())
                        return
            raise StreamEndedEarly(f"the stream of {path} closed before its end")
        except transport.Refused as exc:
            raise stream_refused(exc.answer) from None
        except RECONNECT_ON:
            if place.moved:
                raise Resumed from None
            raise


class AsyncHandle(Generic[R]):
    """A submitted invocation, awaited from an event loop."""

    def __init__(self, client: AsyncClient, invocation_id: str) -> None:
        self.client = client
        self.id = invocation_id

    def __repr__(self) -> str:
        return f"AsyncHandle({self.id!r})"

    async def info(self) -> dict[str, Any]:
        return await self.client.get(self.id)

    async def state(self) -> str:
        return str((await self.info())["state"])

    async def cancel(self) -> None:
        await self.client.cancel(self.id)

    async def result(self, timeout: float | None = None) -> R:  # noqa: ASYNC109 - as Handle's
        """Wait for the invocation to end (on its end event); its result, or its error
        raised here. ``TimeoutError`` after ``timeout`` seconds."""
        return outcome(await self.client.ended(self.id, timeout))  # type: ignore[no-any-return]

    async def stream(self) -> AsyncIterator[Any]:
        """Each item a generator UDF yields, as it yields it; at the end the remote error
        is raised if the invocation did not succeed."""
        async for kind, value in self.client.follow(self.id):
            if kind == "item":
                yield value
            else:
                outcome(value)


async def agather(
    handles: Sequence[AsyncHandle[Any]],
    *,
    timeout: float | None = None,  # noqa: ASYNC109 - as lakeshore.gather's
    return_exceptions: bool = False,
) -> list[Any]:
    """Each invocation's result, in the handles' order, once all have ended, as
    :func:`lakeshore.gather`: the first failed one's error (in that order) is raised,
    unless ``return_exceptions``; ``TimeoutError`` once ``timeout`` seconds have gone by
    for them all. One stream connection at a time, whatever the number of handles."""
    deadline = None if timeout is None else time.monotonic() + timeout
    results: list[Any] = []
    for handle in handles:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        results.append(taken(await handle.client.ended(handle.id, left), return_exceptions))
    return results
