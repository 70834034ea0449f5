"""The Python SDK: ``@udf(queue=...)`` functions, ``f.submit(...)`` handles, ``Client``.

    from lakeshore import udf

    @udf(queue="gpu")
    def embed(text: str) -> list[float]: ...

    handle = embed.submit("hello", _key="doc-1")
    vector = handle.result(timeout=60)
    later = embed.submit("tomorrow", _delay=3600)  # claimable an hour from now

``_delay`` (seconds) or ``_not_before`` (an aware ``datetime``) holds an invocation back:
it is pending, counted as ``scheduled``, until then (at most a year ahead).

A generator UDF streams: ``for item in handle.stream(): ...`` yields each item as the
daemon yields it, then raises the remote error if the invocation failed.

A UDF must live in a module the daemons can import (not ``__main__``); they call it by its
import path. Calling ``embed(...)`` directly still runs it here. ``Client`` reads
``LAKESHORE_URL``, ``LAKESHORE_TOKEN`` and ``LAKESHORE_NAMESPACE`` like the CLI does.
"""

from __future__ import annotations

import builtins
import functools
import os
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, NoReturn, ParamSpec, TypeVar
from urllib.parse import quote

from lakeshore import jsontext, refusals, transport
from lakeshore.defaults import DEFAULT_URL, read_local_admin_token

if TYPE_CHECKING:
    import asyncio  # not at run time: a daemon child running plain functions never loads it

    from lakeshore.async_client import AsyncClient, AsyncHandle

P = ParamSpec("P")
R = TypeVar("R")
FINAL = frozenset({"succeeded", "failed", "cancelled", "expired"})
BATCH_MAX = 1000  # invocations per batch request, as the server takes them
LAST_ITEM = 2**31 - 1  # the highest item number: a stream asked after it sends only its end
STREAM_READ_S = 60.0  # the longest read of a stream (the server pings every 15 s)
STREAM_RECONNECTS = 5


class LakeshoreClientError(Exception):
    """The server refused a request (the message is the server's)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{message} [{status} {code}]")
        self.status, self.code, self.message = status, code, message


class StreamEndedEarly(ConnectionError):
    """A stream closed before its end event, or was refused for now (the server stopping
    or overloaded: 429, 5xx): it is tried again."""


def stream_refused(answer: transport.Answer) -> Exception:
    """A stream the server would not open: tried again when the refusal is for now."""
    if answer.status_code == 429 or answer.status_code >= 500:
        return StreamEndedEarly(f"the server answered {answer.status_code} for now")
    return refused(answer.status_code, answer.content)


class RemoteError(Exception):
    """An invocation failed remotely with an exception type not known here."""

    def __init__(self, type_name: str, message: str, traceback: str | None = None) -> None:
        super().__init__(f"{type_name}: {message}")
        self.type_name, self.message, self.remote_traceback = type_name, message, traceback


def _remote_exception(error: dict[str, Any]) -> Exception:
    """The remote error as its own type when it is a builtin exception, else RemoteError."""
    type_name = str(error.get("type", "Error"))
    message = str(error.get("message", ""))
    kind = getattr(builtins, type_name, None)
    if isinstance(kind, type) and issubclass(kind, Exception):
        try:
            exc = kind(message)
        except Exception:  # an exception type with another signature
            exc = RemoteError(type_name, message, error.get("traceback"))
    else:
        exc = RemoteError(type_name, message, error.get("traceback"))
    exc.__notes__ = [f"remote traceback:\n{error.get('traceback') or '(none)'}"]
    return exc


class Client:
    """The server's API from Python: submit (one or many), read, cancel, follow.

    Requests go over :mod:`lakeshore.transport` (kept-alive connections: a submit costs
    one round trip and little else), safe to share between threads. Proxies and
    certificates are read from the environment as every Lakeshore client reads them
    (``HTTPS_PROXY``, ``NO_PROXY``, ``LAKESHORE_CA_BUNDLE``…); ``ca`` names a
    certificate file or directory to trust instead."""

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
        # a refused connection is tried once more; nothing that may have reached the
        # server is sent again, so a submit is never made twice by the client
        self._http = transport.connect(
            self.url, headers=auth, timeout=timeout, size=connections, ca=ca
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _path(self, *segments: str) -> str:
        return namespace_path(self.namespace, *segments)

    def request(
        self, method: str, path: str, *, json: Any = None, params: dict[str, Any] | None = None
    ) -> Any:
        """``method path`` with ``json`` as its body: the answer's JSON, or
        :class:`LakeshoreClientError` with the server's words; ``ConnectionError`` when
        the server cannot be reached."""
        try:
            answer = self._http.request(method, path, json=json, params=params)
        except transport.Unreachable as exc:
            raise ConnectionError(f"cannot reach the server at {self.url}: {exc}") from None
        if not answer.is_success:
            _raise(answer.status_code, answer.content)
        return answer.json()  # an integer past 64 bits is read as one

    def submit(
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
    ) -> Handle[Any]:
        """Submit one call; ``delay_s`` or ``not_before`` (not both) holds it back until
        then (at most a year ahead). ``retry`` is this call's retry policy (its fields
        over the queue's: ``docs/taskqueue.md``); ``concurrency_key`` the key the queue's
        ``max_running_per_key`` counts and takes turns by."""
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
        created = self.request("POST", self._path("queues", queue, "invocations"), json=body)
        return Handle(self, created["id"])

    def submit_many(
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
    ) -> list[Handle[Any]]:
        """Submit ``fn`` once per item of ``args_list`` (each the call's positional
        arguments; ``kwargs_list``, when given, the keyword arguments, item by item), in
        order, 1,000 to a request, each with the options given. Each request's batch is
        stored whole or not at all; the handles come back in the calls' order."""
        path = self._path("queues", queue, "invocations", "batch") + "?answer=ids"
        handles: list[Handle[Any]] = []
        options: dict[str, Any] = {"max_attempts": max_attempts, "timeout_s": timeout_s}
        options.update(retry=retry, concurrency_key=concurrency_key)
        for batch in batches(fn, args_list, kwargs_list, **options):
            answer = self.request("POST", path, json={"invocations": batch})
            handles.extend(Handle(self, item["id"]) for item in answer["invocations"])
        return handles

    def get(self, invocation_id: str) -> dict[str, Any]:
        return dict(self.request("GET", self._path("invocations", invocation_id)))

    def cancel(self, invocation_id: str) -> dict[str, Any]:
        return dict(self.request("POST", self._path("invocations", invocation_id, "cancel")))

    def ended(self, invocation_id: str, timeout: float | None = None) -> dict[str, Any]:
        """The invocation once it has ended, read from its stream's ``end`` event (asked
        for after the last item there can be, so no item is sent, and nothing is
        polled); ``TimeoutError`` once ``timeout`` seconds have gone by. One connection,
        reused from wait to wait, whatever the number of invocations waited for."""
        path = self._path("invocations", invocation_id, "stream")
        deadline = None if timeout is None else time.monotonic() + timeout
        from lakeshore import backoff  # here: tenacity loads asyncio, which a child need not

        tries = backoff.retrying(RECONNECT_ON, tries=STREAM_RECONNECTS + 1)
        return tries(self._wait_end, path, deadline, invocation_id, timeout)

    def _wait_end(
        self, path: str, deadline: float | None, invocation_id: str, timeout: float | None
    ) -> dict[str, Any]:
        """The invocation at its end, read on one connection; a read with no word (the
        server pings every 15 s) is asked again until the deadline."""
        while True:
            read = read_bound(deadline, invocation_id, timeout)
            try:
                return self._end_of(path, read)
            except transport.TimedOut:
                continue  # no word within the read's time: the deadline decides

    def _end_of(self, path: str, read_s: float) -> dict[str, Any]:
        """One look at a stream, after its last item: the invocation at its end."""
        try:
            with self._http.events(path, params={"after": LAST_ITEM}, read_s=read_s) as events:
                for event in events:
                    if event.event == "end":
                        return dict(jsontext.parsed(event.data.encode()))
        except transport.Refused as exc:
            raise stream_refused(exc.answer) from None
        raise StreamEndedEarly(f"the stream of {path} ended before the invocation did")

    def follow(
        self, invocation_id: str, *, after: int = -1, reconnects: int = STREAM_RECONNECTS
    ) -> Iterator[tuple[str, Any]]:
        """The invocation's stream: ``("item", value)`` for each item as it arrives, then
        ``("end", invocation)``. A dropped connection is resumed where it left off, at
        once when it brought items, else after a back-off (``reconnects`` in a row)."""
        from lakeshore import backoff  # as in ended

        path = self._path("invocations", invocation_id, "stream")
        place = Place(after)
        while True:
            try:
                for attempt in backoff.retrying(RECONNECT_ON, tries=reconnects + 1):
                    with attempt:
                        yield from self._follow_once(path, place)
                        return
            except Resumed:
                continue

    def _follow_once(self, path: str, place: Place) -> Iterator[tuple[str, Any]]:
        """One connection's events of the stream, from ``place`` on."""
        place.moved = False
        try:
            # the server pings every 15 s: a longer silence is a dead peer
            with self._http.events(
                path, params={"after": place.after}, read_s=STREAM_READ_S
            ) as events:
                for event in events:
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


class Place:
    """Where a stream's reader is: the last item it has, and whether the connection
    at hand brought any."""

    __slots__ = ("after", "moved")

    def __init__(self, after: int) -> None:
        self.after = after
        self.moved = False


class Resumed(Exception):
    """A connection that brought items broke: it is made again at once, with a new
    count of tries."""


RECONNECT_ON = (transport.Unreachable, StreamEndedEarly)


class Handle(Generic[R]):
    """A submitted invocation."""

    def __init__(self, client: Client, invocation_id: str) -> None:
        self.client = client
        self.id = invocation_id

    def __repr__(self) -> str:
        return f"Handle({self.id!r})"

    def info(self) -> dict[str, Any]:
        return self.client.get(self.id)

    def state(self) -> str:
        return str(self.info()["state"])

    def cancel(self) -> None:
        self.client.cancel(self.id)

    def result(self, timeout: float | None = None) -> R:
        """Wait for the invocation to end (on its end event: :meth:`Client.ended`); its
        result, or its error raised here. ``TimeoutError`` after ``timeout`` seconds."""
        return outcome(self.client.ended(self.id, timeout))  # type: ignore[no-any-return]

    def stream(self) -> Iterator[Any]:
        """Each item a generator UDF yields, as it yields it; at the end the remote error
        is raised if the invocation did not succeed."""
        for kind, value in self.client.follow(self.id):
            if kind == "item":
                yield value
            else:
                outcome(value)


def settings(
    url: str | None, token: str | None, namespace: str | None
) -> tuple[str, str, dict[str, str]]:
    """A client's server, namespace and auth header: as given, else ``LAKESHORE_URL``,
    ``LAKESHORE_TOKEN`` (else the local admin token) and ``LAKESHORE_NAMESPACE``."""
    url = (url or os.environ.get("LAKESHORE_URL") or DEFAULT_URL).rstrip("/")
    token = token or os.environ.get("LAKESHORE_TOKEN") or read_local_admin_token()
    namespace = namespace or os.environ.get("LAKESHORE_NAMESPACE") or "default"
    return url, namespace, {"Authorization": f"Bearer {token.strip()}"} if token else {}


def namespace_path(namespace: str, *segments: str) -> str:
    """The API's path of ``segments`` in ``namespace``, each segment quoted."""
    parts = [namespace, *segments]
    return "/v1/namespaces/" + "/".join(quote(part, safe="") for part in parts)


def submit_body(
    fn: str,
    args: Sequence[Any],
    kwargs: dict[str, Any] | None,
    *,
    key: str | None = None,
    max_attempts: int | None = None,
    timeout_s: float | None = None,
    delay_s: float | None = None,
    not_before: datetime | None = None,
    retry: Mapping[str, Any] | None = None,
    concurrency_key: str | None = None,
) -> dict[str, Any]:
    """One submit's body, as both clients send it (an option left ``None`` is not sent:
    the server's default, or the queue's, holds)."""
    body: dict[str, Any] = {"fn": fn, "args": list(args), "kwargs": kwargs or {}}
    for name, value in (
        ("key", key),
        ("max_attempts", max_attempts),
        ("timeout_s", timeout_s),
        ("retry", dict(retry) if retry else None),
        ("concurrency_key", concurrency_key),
    ):
        if value is not None:
            body[name] = value
    body.update(_delay(delay_s, not_before))
    return body


def batches(
    fn: str,
    args_list: Iterable[Sequence[Any]],
    kwargs_list: Iterable[dict[str, Any]] | None,
    **options: Any,
) -> Iterator[list[dict[str, Any]]]:
    """The bodies of ``fn``'s calls (``args_list``, with ``kwargs_list``'s item by item),
    each with ``options`` (:func:`submit_body`'s), :data:`BATCH_MAX` to a batch, in
    order; ``ValueError`` when the lengths differ."""
    calls: Iterable[tuple[Sequence[Any], dict[str, Any] | None]] = (
        ((args, None) for args in args_list)
        if kwargs_list is None
        else zip(args_list, kwargs_list, strict=True)
    )
    # the options are the same for every call: made into a body once, each call's
    # arguments set on a copy of it
    template = submit_body(fn, (), None, **options)
    batch: list[dict[str, Any]] = []
    for args, kwargs in calls:
        batch.append({**template, "args": list(args), "kwargs": kwargs or {}})
        if len(batch) == BATCH_MAX:
            yield batch
            batch = []
    if batch:
        yield batch


def read_bound(deadline: float | None, invocation_id: str, timeout: float | None) -> float:
    """How long the next read of an invocation's stream may wait (the server pings every
    15 s: a longer silence means a dead peer), or ``TimeoutError`` once ``deadline`` (of
    ``time.monotonic``) has passed."""
    left = None if deadline is None else deadline - time.monotonic()
    if left is not None and left <= 0:
        raise TimeoutError(f"invocation {invocation_id} has not ended after {timeout} s")
    return STREAM_READ_S if left is None else min(STREAM_READ_S, left)


def _delay(delay_s: float | None, not_before: datetime | None) -> dict[str, Any]:
    """A submit's delay, as the body carries it."""
    if delay_s is not None and not_before is not None:
        raise ValueError("give delay_s or not_before, not both")
    if delay_s is not None:
        return {"delay_s": delay_s}
    if not_before is not None:
        if not_before.tzinfo is None or not_before.utcoffset() is None:
            raise ValueError("not_before must be an aware datetime (with its time zone)")
        return {"not_before": not_before.isoformat()}
    return {}


def refused(status: int, data: bytes) -> LakeshoreClientError:
    """The server's refusal as :class:`LakeshoreClientError`."""
    refusal = refusals.read(status, data)
    return LakeshoreClientError(status, refusal.code, refusal.message)


def _raise(status: int, data: bytes) -> NoReturn:
    raise refused(status, data)


def outcome(info: dict[str, Any]) -> Any:
    """A final invocation's result, or its error raised."""
    if info["state"] == "succeeded":
        return info["result"]
    if info["state"] == "failed":
        raise _remote_exception(info.get("error") or {})
    raise RemoteError(info["state"].capitalize(), f"invocation {info['id']} was {info['state']}")


class UDF(Generic[P, R]):
    """A function that can also be submitted to a queue."""

    def __init__(
        self,
        func: Callable[P, R],
        queue: str,
        *,
        max_attempts: int | None,
        timeout_s: float | None,
        client: Client | None,
        setup: Callable[[], Any] | None = None,
        retry: Mapping[str, Any] | None = None,
    ) -> None:
        functools.update_wrapper(self, func)
        self.func, self.queue = func, queue
        self.max_attempts, self.timeout_s = max_attempts, timeout_s
        self.setup = setup
        self.retry = dict(retry) if retry else None  # the function's policy (its fields)
        self._client = client
        self._aclient: AsyncClient | None = None  # asubmit's and amap's, when bound
        self._aclients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncClient] = (
            weakref.WeakKeyDictionary()
        )  # otherwise one of the environment's for each event loop
        self.path = f"{func.__module__}:{func.__qualname__}"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.func(*args, **kwargs)

    def bind(self, client: Client | AsyncClient) -> UDF[P, R]:
        """The same UDF, submitting through ``client``: a :class:`Client` for ``submit``
        and ``map``, an :class:`~lakeshore.async_client.AsyncClient` for ``asubmit`` and
        ``amap``."""
        bound = UDF(
            self.func,
            self.queue,
            max_attempts=self.max_attempts,
            timeout_s=self.timeout_s,
            client=client if isinstance(client, Client) else self._client,
            setup=self.setup,
            retry=self.retry,
        )
        bound._aclient = self._aclient if isinstance(client, Client) else client
        return bound

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = Client()
        return self._client

    @property
    def aclient(self) -> AsyncClient:
        """The async client ``asubmit`` and ``amap`` go through: the bound one, else one
        made from the environment for the running event loop."""
        if self._aclient is not None:
            return self._aclient
        import asyncio

        from lakeshore.async_client import AsyncClient

        loop = asyncio.get_running_loop()
        made = self._aclients.get(loop)
        if made is None:
            made = self._aclients[loop] = AsyncClient()
        return made

    def submit(
        self,
        *args: Any,
        _key: str | None = None,
        _delay: float | None = None,
        _not_before: datetime | None = None,
        _retry: Mapping[str, Any] | None = None,
        _concurrency_key: str | None = None,
        **kwargs: Any,
    ) -> Handle[R]:
        """Submit a call; ``_delay`` (seconds) or ``_not_before`` (an aware datetime)
        holds it back until then; ``_retry``'s fields override the function's policy for
        this call; ``_concurrency_key`` names the key the queue's per-key limit counts."""
        options = self._options(_key, _delay, _not_before, _retry, _concurrency_key)
        return self.client.submit(self.queue, self.path, args, kwargs, **options)

    def submit_many(
        self,
        args_list: Iterable[Sequence[Any]],
        kwargs_list: Iterable[dict[str, Any]] | None = None,
    ) -> list[Handle[R]]:
        """One invocation per item of ``args_list`` (with ``kwargs_list``'s, item by item,
        if given), 1,000 to a request: see :meth:`Client.submit_many`."""
        return self.client.submit_many(
            self.queue, self.path, args_list, kwargs_list, **self._many_options()
        )

    async def asubmit(
        self,
        *args: Any,
        _key: str | None = None,
        _delay: float | None = None,
        _not_before: datetime | None = None,
        _retry: Mapping[str, Any] | None = None,
        _concurrency_key: str | None = None,
        **kwargs: Any,
    ) -> AsyncHandle[R]:
        """:meth:`submit` from an event loop: ``await f.asubmit(...)``."""
        options = self._options(_key, _delay, _not_before, _retry, _concurrency_key)
        return await self.aclient.submit(self.queue, self.path, args, kwargs, **options)

    async def amap(self, *iterables: Iterable[Any]) -> list[AsyncHandle[R]]:
        """:meth:`map` from an event loop: ``await f.amap(xs)``, 1,000 calls to a request;
        wait for them with :func:`lakeshore.agather`."""
        return await self.aclient.submit_many(
            self.queue, self.path, zip(*iterables, strict=False), **self._many_options()
        )

    def map(self, *iterables: Iterable[Any]) -> list[Handle[R]]:
        """One invocation per item of ``iterables`` taken together, as the built-in
        ``map`` calls (``f.map(xs)``: ``f(x)`` for each ``x``; ``f.map(xs, ys)``:
        ``f(x, y)``), 1,000 to a request; the handles in the calls' order (wait for them
        with :func:`gather`)."""
        return self.submit_many(zip(*iterables, strict=False))

    def _options(
        self,
        key: str | None = None,
        delay_s: float | None = None,
        not_before: datetime | None = None,
        retry: Mapping[str, Any] | None = None,
        concurrency_key: str | None = None,
    ) -> dict[str, Any]:
        """A submit's options: the call's own over this function's."""
        self._require_importable()
        return {
            "key": key,
            "max_attempts": self.max_attempts,
            "timeout_s": self.timeout_s,
            "delay_s": delay_s,
            "not_before": not_before,
            "retry": {**(self.retry or {}), **(retry or {})} or None,
            "concurrency_key": concurrency_key,
        }

    def _many_options(self) -> dict[str, Any]:
        """A batch's options: this function's."""
        self._require_importable()
        return {"max_attempts": self.max_attempts, "timeout_s": self.timeout_s, "retry": self.retry}

    def _require_importable(self) -> None:
        if self.func.__module__ == "__main__" or "<locals>" in self.func.__qualname__:
            raise ValueError(
                f"{self.func.__qualname__} must be defined at the top of an importable module "
                "for daemons to run it"
            )


def udf(
    queue: str = "default",
    *,
    max_attempts: int | None = None,
    timeout_s: float | None = None,
    client: Client | None = None,
    setup: Callable[[], Any] | None = None,
    retry: Mapping[str, Any] | None = None,
) -> Callable[[Callable[P, R]], UDF[P, R]]:
    """Make a function submittable to ``queue``: ``f.submit(*args, _key=None, _delay=None,
    _not_before=None, _retry=None, _concurrency_key=None, **kwargs)``.

    ``retry`` is the function's retry policy (``{"max_attempts", "backoff", "base_s",
    "max_s", "jitter", "never", "only"}``, each optional), over the queue's and under a
    submit's ``_retry``.

    ``setup`` (no arguments, plain or ``async def``) runs once in each daemon child before
    the child's first invocation of a function that names it, never where you submit:
    load a model onto the GPU there and keep it in a module-level variable. If it raises,
    the invocation it held up fails with its traceback (retried as usual), and the next
    invocation tries it again."""

    def wrap(func: Callable[P, R]) -> UDF[P, R]:
        return UDF(
            func,
            queue,
            max_attempts=max_attempts,
            timeout_s=timeout_s,
            client=client,
            setup=setup,
            retry=retry,
        )

    return wrap
