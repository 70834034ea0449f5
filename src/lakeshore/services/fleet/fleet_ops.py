"""Launching and retiring one daemon: the paths the controller and the manual fleet
commands (``lakeshore daemon create|delete``) share.

A launch mints the daemon's own worker token and records the launch in flight (a tick's
launches together, in one transaction, before any provider is called, so a crash mid-call
or a call still running when its tick ends holds the slot until its TTL); then it calls the
provider within a time-out, and keeps its handle or fails the launch (freeing the slot and
revoking the token). A retirement marks the worker retiring in the transaction that
checks it holds nothing, asks its provider to stop it, then removes its row, refuses its
id from then on, revokes its launch's token and wakes its waiting claim (410).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar

from sqlalchemy import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection

from lakeshore.domain import fleet, tokens
from lakeshore.domain.ids import new_id
from lakeshore.domain.queue import DaemonTemplate
from lakeshore.providers import LaunchRequest, Provider, build
from lakeshore.services.taskqueue.claims import worker_key
from lakeshore.services.taskqueue.notify import Notifier
from lakeshore.store import controller as ctl_store
from lakeshore.store import launches as launch_store
from lakeshore.store import namespaces as ns_store
from lakeshore.store import wakeups
from lakeshore.store.engine import Store

Clock = Callable[[], datetime]


CONCURRENCY = 16  # provider calls in flight at once, per server
Row = TypeVar("Row")


class _GroupCommit(Generic[Row]):
    """Rows written together by ``write_many``: each caller waits for its own row to be
    committed; those that arrive while a write runs go in the next one."""

    def __init__(
        self,
        store: Store,
        write_many: Callable[[AsyncConnection, Sequence[Row]], Awaitable[None]],
    ) -> None:
        self.store = store
        self.write_many = write_many
        self._waiting: list[tuple[Row, asyncio.Future[None]]] = []
        self._writer: asyncio.Task[None] | None = None

    async def commit(self, row: Row) -> None:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((row, done))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write())
        await asyncio.shield(done)  # a caller cancelled still has its handle written

    async def _write(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting, []
            try:
                async with self.store.write() as conn:
                    await self.write_many(conn, [row for row, _ in batch])
            except Exception as exc:
                for _, done in batch:
                    if not done.done():
                        done.set_exception(exc)
            else:
                for _, done in batch:
                    if not done.done():
                        done.set_result(None)


@dataclass(frozen=True)
class Launched:
    """A launch's outcome: its id (once recorded), and the failure if it failed."""

    launch_id: str | None
    failure: str | None = None


@dataclass(frozen=True)
class LaunchSpec:
    """One daemon to launch for ``scope``: through which provider, from which template,
    joining which queues."""

    namespace_id: str
    namespace: str
    scope: str
    provider_name: str
    registration: RowMapping | None
    template: DaemonTemplate | None
    membership: Sequence[str]


@dataclass(frozen=True)
class Prepared:
    """A launch recorded in flight, ready for its provider call."""

    launch_id: str
    provider: Provider
    request: LaunchRequest
    token_id: str
    limit: float  # seconds the provider call may take


@dataclass(frozen=True)
class Retired:
    """A retirement's outcome: ``status`` is retired, busy or gone; ``failure`` says why a
    provider could not stop it (the worker then stays, no longer retiring)."""

    status: str
    failure: str | None = None


class FleetOps:
    def __init__(
        self,
        store: Store,
        *,
        clock: Clock,
        server_url: str,
        call_timeout_s: float,
        notifier: Notifier,
    ) -> None:
        self.store = store
        self.clock = clock
        self.server_url = server_url
        self.call_timeout_s = call_timeout_s
        self.notifier = notifier
        self.gate = asyncio.Semaphore(CONCURRENCY)  # provider calls at once, at most
        # launch handles and terminations: a tick of 1,000 launches (or of 1,000 expired
        # ones) writes them in a few statements, not 1,000
        self._handles: _GroupCommit[tuple[str, Any, datetime]] = _GroupCommit(
            store, lambda conn, rows: launch_store.started_many(conn, rows)
        )
        self._terminations: _GroupCommit[tuple[str, datetime, str | None]] = _GroupCommit(
            store, lambda conn, rows: launch_store.terminated_many(conn, rows)
        )

    async def call(
        self,
        provider: Provider,
        what: str,
        call: Callable[[], Any],
        *,
        timeout_s: float | None = None,
    ) -> Any:
        """The call's result, or a failure message (an exception or a time-out)."""
        limit = timeout_s or self.call_timeout_s
        try:
            async with asyncio.timeout(limit):
                return await call()
        except TimeoutError:
            return f'{what} failed: provider "{provider.name}" did not answer within {limit:g} s'
        except Exception as exc:
            return f"{what} failed: {exc or type(exc).__name__}"

    async def launch(
        self,
        *,
        namespace_id: str,
        namespace: str,
        scope: str,
        provider_name: str,
        registration: RowMapping | None,
        template: DaemonTemplate | None,
        membership: Sequence[str],
    ) -> Launched:
        """Launch one daemon for ``scope`` through ``provider_name``."""
        wanted = LaunchSpec(
            namespace_id, namespace, scope, provider_name, registration, template, membership
        )
        [prepared] = await self.prepare([wanted])
        if isinstance(prepared, Launched):
            return prepared
        return await self.start(prepared)

    async def prepare(self, wanted: Sequence[LaunchSpec]) -> list[Prepared | Launched]:
        """Record launches in flight, each with a worker token of its own, in one
        transaction — before any provider is called, so a launch still running when its
        tick ends (or a crash mid-call) holds its slot until its TTL. A launch whose
        provider is not registered or cannot be built is a failed ``Launched``, recorded
        nowhere."""
        now = self.clock()
        answers: list[Prepared | Launched] = []
        token_rows: list[dict[str, Any]] = []
        launch_rows: list[dict[str, Any]] = []
        for one in wanted:
            if one.registration is None:
                answers.append(
                    Launched(
                        None,
                        f'provider "{one.provider_name}" is not registered in namespace '
                        f'"{one.namespace}"',
                    )
                )
                continue
            kind, config = one.registration["kind"], one.registration["config"]
            try:
                provider = build(one.provider_name, kind, config)
            except Exception as exc:
                answers.append(
                    Launched(None, f'provider "{one.provider_name}" is misconfigured: {exc}')
                )
                continue
            body = fleet.launch_body(one.template, one.membership)
            launch_id, token = new_id("lch"), tokens.mint()
            request = LaunchRequest(
                launch_id, one.namespace, one.scope, self.server_url, token.plaintext, body
            )
            limit = self._call_limit(provider, request)
            token_rows.append(
                {
                    "id": token.id,
                    "namespace_id": one.namespace_id,
                    "kind": "worker",
                    "name": f"launch {launch_id}",
                    "secret_hash": token.secret_hash,
                    "worker_id": None,
                    "created_at": now,
                }
            )
            launch_rows.append(
                {
                    "id": launch_id,
                    "namespace_id": one.namespace_id,
                    "scope": one.scope,
                    "provider_name": one.provider_name,
                    "body": dataclasses.asdict(body),
                    "token_id": token.id,
                    "created_at": now,
                    # the call's own time, then the TTL (reset from the call's return)
                    "expires_at": now + timedelta(seconds=limit + provider.launch_ttl_s),
                }
            )
            answers.append(Prepared(launch_id, provider, request, token.id, limit))
        if launch_rows:
            async with self.store.write() as conn:
                await ns_store.insert_tokens(conn, token_rows)
                await launch_store.record(conn, launch_rows)
        return answers

    async def start(self, prepared: Prepared) -> Launched:
        """Call the provider for a recorded launch; keep its handle, or fail the launch
        (freeing the slot at once and revoking its token)."""
        provider, launch_id = prepared.provider, prepared.launch_id
        async with self.gate:
            result = await self.call(
                provider,
                "launch",
                lambda: provider.launch(prepared.request),
                timeout_s=prepared.limit,
            )
        if isinstance(result, str):  # the slot is free again at once
            async with self.store.write() as conn:
                await launch_store.resolve(
                    conn, launch_id, state="failed", now=self.clock(), error=result
                )
                await ns_store.revoke_token(conn, prepared.token_id, self.clock())
            return Launched(launch_id, result)
        ttl = timedelta(seconds=provider.launch_ttl_s)
        # committed before this returns, with the handles of the launches that answered
        # meanwhile
        await self._handles.commit((launch_id, result, self.clock() + ttl))
        return Launched(launch_id)

    def _call_limit(self, provider: Provider, request: LaunchRequest) -> float:
        """How long a launch call may take: the call time-out, or longer for a provider
        that does slow work inside its launch (local setup scripts) and says so."""
        own = getattr(provider, "launch_timeout", None)
        if callable(own):
            return max(self.call_timeout_s, float(own(request)))
        return self.call_timeout_s

    async def retire(
        self,
        *,
        namespace_id: str,
        worker_id: str,
        reason: str,
        registrations: dict[tuple[str, str], Any] | None = None,
    ) -> Retired:
        """Retire an idle worker: never one that holds a running invocation."""
        marked = await self.mark_retiring(worker_id)
        if isinstance(marked, Retired):
            return marked
        return await self.finish_retiring(
            namespace_id=namespace_id,
            worker_id=worker_id,
            launch=marked,
            reason=reason,
            registrations=registrations,
        )

    async def mark_retiring(self, worker_id: str) -> RowMapping | Retired | None:
        """Mark the worker retiring in the transaction that checks it is idle (from then on
        it gets no new claim): its launch record (or None), or ``Retired`` busy or gone."""
        async with self.store.write() as conn:
            status = await ctl_store.retire_if_idle(conn, worker_id)
            launch = await launch_store.for_worker(conn, worker_id)
        return launch if status == "retiring" else Retired(status)

    async def finish_retiring(
        self,
        *,
        namespace_id: str,
        worker_id: str,
        launch: RowMapping | None,
        reason: str,
        registrations: dict[tuple[str, str], Any] | None = None,
    ) -> Retired:
        """Stop a worker marked retiring at its provider, then remove it; if the provider
        fails, the worker stays (no longer retiring)."""
        failure = await self._terminate(namespace_id, worker_id, launch, registrations or {})
        async with self.store.write() as conn:
            if failure is not None:
                await ctl_store.unretire(conn, worker_id)
                return Retired("busy", failure)
            now = self.clock()
            await ctl_store.retire(conn, worker_id, namespace_id, reason, now)
            if launch is not None:
                await launch_store.terminated(conn, launch["id"], now)
                if launch["token_id"]:
                    await ns_store.revoke_token(conn, launch["token_id"], now)
            await wakeups.publish(conn, [worker_key(worker_id)])
        self.notifier.notify([worker_key(worker_id)])  # its waiting claim answers 410
        return Retired("retired")

    async def stop_expired(
        self, launch: RowMapping, registrations: dict[tuple[str, str], Any] | None = None
    ) -> None:
        """Stop what an expired launch started (its daemon never said hello), or a launched
        daemon whose worker was dropped as lost: a booted instance or pod would otherwise
        run, and cost, for nothing."""
        worker_id = launch["worker_id"] or ""
        async with self.gate:
            failure = await self._terminate(
                launch["namespace_id"], worker_id, launch, registrations or {}
            )
        await self._terminations.commit((launch["id"], self.clock(), failure))

    async def _terminate(
        self,
        namespace_id: str,
        worker_id: str,
        launch: RowMapping | None,
        registrations: dict[tuple[str, str], Any],
    ) -> str | None:
        """Ask the worker's provider to stop it; a failure message, or None.

        A daemon started by hand (no launch record), or whose provider registration is
        gone, has nothing to call: retiring it is enough, since its next claim or
        heartbeat is refused (410) and it exits by itself.
        """
        if launch is None or launch["handle"] is None:
            return None
        name = launch["provider_name"]
        registration = registrations.get((namespace_id, name))
        if registration is None:
            async with self.store.read() as conn:
                registration = await ctl_store.registration(conn, namespace_id, name)
        if registration is None:
            return None
        try:
            provider = build(name, registration["kind"], registration["config"])
        except Exception as exc:
            return f"terminate failed: provider misconfigured: {exc}"
        result = await self.call(
            provider, "terminate", lambda: provider.terminate(launch["handle"], worker_id)
        )
        return result if isinstance(result, str) else None
