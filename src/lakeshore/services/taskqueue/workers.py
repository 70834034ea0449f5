"""The task queue's worker side: hello, long-poll claim, heartbeat, complete, fail (the
reaper that returns a dead worker's work to the queue is :mod:`.reaper`)."""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Annotated, Any, Final

from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError
from sqlalchemy import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection

from lakeshore.domain import access, jsonsafe
from lakeshore.domain.ids import new_id
from lakeshore.domain.invocations import Report
from lakeshore.domain.names import Name
from lakeshore.domain.queue import parse_spec
from lakeshore.domain.validation import invalid_input
from lakeshore.errors import Conflict, Forbidden, Gone, InvalidInput, NotFound
from lakeshore.services import namespaces as ns_service
from lakeshore.services.auth import Principal
from lakeshore.services.metrics import Metrics
from lakeshore.services.taskqueue import claims
from lakeshore.services.taskqueue.handoff import Waiting
from lakeshore.services.taskqueue.invocations import stream_key, to_json
from lakeshore.services.taskqueue.notify import Hangup, Notifier
from lakeshore.store import invocations as inv_store
from lakeshore.store import launches as launch_store
from lakeshore.store import leases as lease_store
from lakeshore.store import namespaces as ns_store
from lakeshore.store import queues as queue_store
from lakeshore.store import wakeups
from lakeshore.store import workers as worker_store
from lakeshore.store.engine import Store

LEASE_S = 30.0
HEARTBEAT_S = 10.0
MAX_CLAIM_WAIT_S = 20.0
IDLE_RECHECK_S = 5.0  # the spec's idle wait, kept only as the fallback re-check

Label = Annotated[StrictStr, Field(min_length=1, max_length=256)]


class Unchanged(enum.Enum):
    """A field a request left out (as opposed to one it set to null)."""

    UNCHANGED = "unchanged"


UNCHANGED: Final = Unchanged.UNCHANGED


class Capabilities(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)
    max_invocations: Annotated[int, Field(strict=True, ge=1, le=10_000)] = 1
    current_invocations: Annotated[int, Field(strict=True, ge=0, le=2**31 - 1)] | None = None
    cost_weight: Annotated[float, Field(ge=0, le=1e6)] | None = None
    # invocations it may hold beyond max_invocations, waiting for a free slot (a daemon's
    # --prefetch): claimed ahead so a slot never waits on a round trip
    prefetch: Annotated[int, Field(strict=True, ge=0, le=10_000)] | None = None
    # an id the daemon picks as it starts: its sentinel's crash report names it, so the
    # report cannot drop a successor that said hello with the same worker id meanwhile
    session: Annotated[StrictStr, Field(min_length=1, max_length=64)] | None = None


class Hello(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)
    id: Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9_.-]{1,40}$")] | None = None
    namespace: Name | None = None
    queues: list[Name] = Field(default_factory=list, max_length=256)
    runners: list[Label] = Field(default_factory=lambda: ["process"], max_length=64)
    tags: list[Label] = Field(default_factory=list, max_length=256)
    capabilities: Capabilities = Field(default_factory=Capabilities)
    launch_id: Annotated[StrictStr, Field(max_length=40)] | None = None


@dataclass(frozen=True)
class WorkerRef:
    id: str
    namespace_id: str
    max_invocations: int
    reach: claims.Reach
    prefetch: int = 0
    caller: access.Caller | None = None  # whom queues' authPolicy.claim is read for

    @property
    def holds(self) -> int:
        """The most invocations it may hold at once: its capacity and its prefetch."""
        return self.max_invocations + self.prefetch


def parse_hello(body: Any) -> Hello:
    if not isinstance(body, dict):
        raise InvalidInput("hello takes a JSON object")
    jsonsafe.require_storable(body)  # ids, labels and capabilities are stored as they come
    try:
        return Hello.model_validate(body)
    except ValidationError as exc:
        raise invalid_input(exc) from exc


async def hello(
    store: Store, caller: Principal, body: Any, now: datetime, *, lease_s: float = LEASE_S
) -> dict[str, Any]:
    """Register or refresh a worker. Its namespace comes from the token (the admin may name
    one); no queues means the namespace's ``default`` queue."""
    request = parse_hello(body)
    if caller.is_admin:
        ns = await ns_service.resolve(store, caller, request.namespace or "default")
    elif request.namespace not in (None, caller.namespace):
        raise Forbidden("a worker's namespace comes from its token")
    else:
        ns = await ns_service.resolve(store, caller, caller.namespace or "")
    names = sorted(set(request.queues)) or ["default"]
    async with store.write() as conn:
        name, worker_id = await _identify(conn, caller, ns.id, request.id)
        launch_id = request.launch_id
        if caller.kind == "worker":
            launch_id = await _bind_worker_token(conn, caller, worker_id, launch_id)
        queue_ids = await _queues_for(conn, caller, ns.id, names, now)
        caps = request.capabilities
        values = {
            "id": worker_id,
            "namespace_id": ns.id,
            "name": name,
            "launch_id": launch_id,
            "runners": request.runners,
            "tags": request.tags,
            "capabilities": caps.model_dump(exclude_none=True),
            "max_invocations": caps.max_invocations,
            "current_invocations": caps.current_invocations,
            "cost_weight": caps.cost_weight,
        }
        await worker_store.upsert(conn, values=values, queue_ids=queue_ids, now=now)
        if launch_id:
            await launch_store.hello(conn, ns.id, launch_id, worker_id, now)
    return {
        "id": name,
        "namespace": ns.name,
        "queues": names,
        "max_invocations": caps.max_invocations,
        "lease_s": lease_s,
        "heartbeat_s": min(HEARTBEAT_S, lease_s / 3),
    }


async def _identify(
    conn: AsyncConnection, caller: Principal, namespace_id: str, asked: str | None
) -> tuple[str, str]:
    """The worker a hello registers or refreshes: the id its namespace knows it by, and the
    row's key. Ids are the namespace's own: another namespace using the same id is neither
    refused nor told (the newcomer's row gets a fresh key); a retired id is refused (410)."""
    name = asked
    if name is None and caller.worker_id:  # a worker token's own worker, saying hello again
        bound = await worker_store.get(conn, caller.worker_id)
        name = str(bound["name"]) if bound is not None else caller.worker_id
    name = name or new_id("wkr")
    existing = await worker_store.get_by_name(conn, namespace_id, name)
    if existing is not None:
        return name, str(existing["id"])
    if await worker_store.is_retired_name(conn, namespace_id, name):
        raise Gone(f'worker "{name}" was retired; start a new one', field="id")
    key = new_id("wkr") if await worker_store.key_taken(conn, name) else name
    return name, key


async def _bind_worker_token(
    conn: AsyncConnection, caller: Principal, worker_id: str, launch_id: str | None
) -> str:
    """A worker token is minted for one launch, and acts for the one worker that launch
    registers: hello binds it to that worker (403 for any other id, or another launch).
    Returns the token's launch id."""
    launch = await launch_store.for_token(conn, caller.token_id or "")
    if launch is None:
        raise Forbidden("this worker token belongs to no launch")
    if launch_id not in (None, launch["id"]):
        raise Forbidden(
            f'this worker token was minted for launch "{launch["id"]}" and says hello only for it',
            field="launch_id",
        )
    if not await ns_store.bind_token(conn, caller.token_id or "", worker_id):
        raise Forbidden(
            "this worker token is bound to another worker: one worker per launch token",
            field="id",
        )
    return str(launch["id"])


async def _queues_for(
    conn: AsyncConnection, caller: Principal, namespace_id: str, names: Sequence[str], now: datetime
) -> list[str]:
    """The ids of the queues a hello names. A namespace (or the admin) token creates the
    ones that do not exist yet; a worker token creates none (404): it may not write queues."""
    queue_ids = []
    for name in names:
        queue = await queue_store.get_queue(conn, namespace_id, name)
        if queue is None and caller.kind == "worker":
            raise NotFound(
                f'queue "{name}" not found: a worker token serves existing queues only',
                field="queues",
            )
        if queue is None:
            queue = await queue_store.insert_queue(
                conn,
                id=new_id("q"),
                namespace_id=namespace_id,
                spec=parse_spec({"name": name}),
                now=now,
            )
        caller.require_access(queue.spec.auth_policy, "claim", queue.name)
        queue_ids.append(queue.id)
    return queue_ids


async def _worker(store: Store, caller: Principal, worker_id: str) -> WorkerRef:
    async with store.read() as conn:
        return await _worker_in(conn, caller, worker_id)


async def _worker_in(conn: AsyncConnection, caller: Principal, worker_id: str) -> WorkerRef:
    """The worker the caller may act for, read in the caller's transaction (404 unknown or
    another namespace's, 410 retired)."""
    row = await _lookup(conn, caller, worker_id) if len(worker_id) <= 40 else None
    if row is None and len(worker_id) <= 40 and await _was_retired(conn, caller, worker_id):
        raise Gone(f'worker "{worker_id}" was retired', field="id")
    if row is None or not _may_act_for(caller, row):
        raise NotFound(f'worker "{worker_id}" not found; say hello first', field="id")
    return WorkerRef(
        id=row["id"],
        namespace_id=row["namespace_id"],
        max_invocations=row["max_invocations"],
        reach=claims.Reach.of(row),
        prefetch=int((row["capabilities"] or {}).get("prefetch") or 0),
        caller=access.Caller(caller.is_admin, caller.kind, caller.token_id, caller.token_name),
    )


async def _lookup(conn: AsyncConnection, caller: Principal, worker_id: str) -> RowMapping | None:
    """The worker a path's id names: the caller's namespace's (the admin's: the worker
    with that key, else the one worker of that id)."""
    if not caller.is_admin:
        return await worker_store.get_by_name(conn, caller.namespace_id or "", worker_id)
    return await worker_store.get(conn, worker_id) or await worker_store.only_by_name(
        conn, worker_id
    )


async def _was_retired(conn: AsyncConnection, caller: Principal, worker_id: str) -> bool:
    if caller.is_admin:
        return await worker_store.is_retired(conn, worker_id)
    return await worker_store.is_retired_name(conn, caller.namespace_id or "", worker_id)


def _may_act_for(caller: Principal, row: RowMapping) -> bool:
    """The admin acts for any worker, a namespace token for its namespace's, a worker
    token for its own worker only."""
    if caller.is_admin:
        return True
    if caller.kind == "worker" and row["id"] != caller.worker_id:
        return False
    return bool(row["namespace_id"] == caller.namespace_id)


async def holder(store: Store, caller: Principal, worker_id: str) -> str:
    """The id of a live worker the caller may act for (404 unknown, 410 retired)."""
    return (await _worker(store, caller, worker_id)).id


async def claim(
    store: Store,
    notifier: Notifier,
    caller: Principal,
    worker_id: str,
    *,
    timeout_s: float | None,
    max_count: int | None,
    clock: Callable[[], datetime],
    lease_s: float = LEASE_S,
    recheck_s: float = IDLE_RECHECK_S,
    gone: Hangup | None = None,
    metrics: Metrics | None = None,
    waiting: Waiting | None = None,
) -> list[dict[str, Any]]:
    """Long-poll: return as soon as anything is claimable (up to the worker's free
    capacity), or an empty list after ``min(timeout_s ?? 20, 20)`` seconds. Own queues
    first; an idle worker may then steal from pool siblings (:mod:`.claims`)."""
    wait = max(0.0, min(MAX_CLAIM_WAIT_S if timeout_s is None else timeout_s, MAX_CLAIM_WAIT_S))
    # the worker is looked up in the first attempt's transaction: a worker with a
    # backlog is served in one transaction, without setting up a wait
    expired: dict[str, int] = {}  # work past its deadline_cutoff_s, expired on the way
    async with store.write() as conn:
        worker = await _worker_in(conn, caller, worker_id)
        limit = worker.max_invocations if max_count is None else max(0, max_count)
        first = None
        if gone is None or not gone.is_set():
            first = await claims.claim_in(
                conn, worker, worker.reach, limit, clock(), lease_s, expired=expired
            )
    # given back to the pool, and let go of here: a claim that waits would otherwise keep
    # the connection's objects alive for its whole wait (~36 KB a waiting claim in all)
    del conn
    if first is not None and (first.claimed or wait <= 0 or limit == 0):
        claimed = first.claimed
    else:
        claimed = await claims.long_poll(
            store,
            notifier,
            worker,
            wait_s=wait,
            limit=limit,
            clock=clock,
            lease_s=lease_s,
            recheck_s=recheck_s,
            gone=gone,
            tried=first is not None,
            expired=expired,
            waiting=waiting,
        )
    await _count_leased(store, metrics, worker.namespace_id, claimed)
    await _count_expired(store, metrics, expired)
    return claimed


async def _count_expired(store: Store, metrics: Metrics | None, expired: dict[str, int]) -> None:
    if metrics is not None and expired:
        await metrics.count_by_queue(store, {(q, "expired"): n for q, n in expired.items()})


async def _count_leased(
    store: Store, metrics: Metrics | None, namespace_id: str, claimed: list[dict[str, Any]]
) -> None:
    if metrics is None or not claimed:
        return
    namespace = await metrics.namespace_name(store, namespace_id)
    if namespace is not None:
        metrics.leased(namespace, claimed)


async def next_claimable_in_s(
    store: Store, caller: Principal, worker_id: str, now: datetime
) -> float | None:
    """Seconds until pending work in the worker's own dispatching queues may be claimed
    (0: already; a retry waiting out its backoff: the rest of it), or None when they hold
    no pending work. A ``--burst`` daemon that found nothing uses it to wait, not exit."""
    async with store.read() as conn:
        worker = await _worker_in(conn, caller, worker_id)
        queues = await worker_store.claimable_queues(conn, worker.id, worker.namespace_id)
        dispatching = [q["id"] for q in queues if q["own"] and q["state"] != "paused"]
        at = await inv_store.next_available_at(conn, dispatching, now)
    return None if at is None else max(0.0, (at - now).total_seconds())


async def heartbeat(
    store: Store,
    notifier: Notifier,
    caller: Principal,
    worker_id: str,
    now: datetime,
    *,
    lease_s: float = LEASE_S,
    running: Collection[str] | None = None,
    prefetched: Collection[str] | None = None,
    current_invocations: int | Unchanged | None = UNCHANGED,
) -> dict[str, Any]:
    """Extend the worker's leases; the answer lists what it still holds, so a daemon
    learns of cancellations and of leases it lost. ``current_invocations``, when given,
    replaces the worker's report of what it runs (``None``: it reports nothing).

    A daemon that says what it has ``running`` (begun) and what it holds ``prefetched``
    (waiting for a slot) gets only those extended, and the ``running`` ones are recorded
    as begun: should the daemon die without a word, only those are charged an attempt.
    What it holds without listing it (a claim's answer lost when a server died
    mid-answer, a result it could not deliver) goes back to its queue at once, attempt
    not counted, unless it was claimed less than a lease ago (that answer may still be
    on its way). Without ``running`` every lease is extended and counts as begun; without
    ``prefetched`` (an older daemon) every one listed in ``running`` does."""
    worker = await _worker(store, caller, worker_id)
    claimed_since = now - timedelta(seconds=lease_s)
    async with store.write() as conn:
        if isinstance(current_invocations, Unchanged):
            await worker_store.touch(conn, worker.id, now)
        else:
            await worker_store.touch(conn, worker.id, now, current=current_invocations)
        released: list[str] = []
        if running is not None:
            listed = [*running, *(prefetched or ())]
            released = await lease_store.hand_back(
                conn, worker.id, now, running=listed, claimed_before=claimed_since
            )
            await wakeups.publish(conn, released)
        held = await lease_store.extend_leases(
            conn,
            worker.id,
            now,
            lease_s,
            running=running,
            prefetched=prefetched,
            claimed_since=claimed_since,
        )
    notifier.notify(released)
    return {
        "held": held,
        "released": len(released),
        "lease_expires_at": (now + timedelta(seconds=lease_s)).isoformat(),
    }


CRASHED = {"type": "WorkerCrashed", "message": "the daemon running this attempt died"}


async def crashed(
    store: Store,
    notifier: Notifier,
    caller: Principal,
    worker_id: str,
    *,
    started: Collection[str],
    session: str | None,
    now: datetime,
    metrics: Metrics | None = None,
) -> dict[str, Any]:
    """A daemon died (its sentinel reports it, with the daemon's token): of what the
    worker holds, the attempts that had begun (``started``, and those its heartbeats said
    had) are charged as an expired lease's are — back to pending after their backoff, or
    failed once spent — and the rest go back to their queues at once, their attempt
    uncounted, without waiting for the leases to run out. Then the worker is gone, as
    after a bye. When ``session`` is not the one the worker's last hello named, a
    successor said hello with the same id meanwhile: only the begun attempts are
    charged, and the successor keeps its row and its leases."""
    worker = await _worker(store, caller, worker_id)
    async with store.write() as conn:
        row = await worker_store.get(conn, worker.id)
        mine = row is not None and (row["capabilities"] or {}).get("session") == session
        counts, by_queue, charged = await lease_store.charge(conn, worker.id, started, now, CRASHED)
        released: list[str] = []
        if mine:
            released = await lease_store.hand_back(conn, worker.id, now, unbegun_only=True)
            await worker_store.remove(conn, worker.id)
        keys = [*released, *(stream_key(i) for i in charged)]
        await wakeups.publish(conn, keys)
    notifier.notify(keys)
    if metrics is not None and by_queue:
        await metrics.count_by_queue(store, by_queue)
    return {
        "retried": counts["retried"],
        "failed": counts["failed"],
        "released": len(released),
        "gone": mine,
    }


async def complete(
    store: Store,
    notifier: Notifier,
    caller: Principal,
    worker_id: str,
    invocation_id: str,
    result: Any,
    now: datetime,
    metrics: Metrics | None = None,
) -> dict[str, Any]:
    async with store.write() as conn:
        worker = await _worker_in(conn, caller, worker_id)
        row = await lease_store.complete(conn, invocation_id, worker.id, result, now)
        if row is None:
            raise _not_held(invocation_id)
        await wakeups.publish(conn, [stream_key(invocation_id)])
        counted = await _count_ended(conn, metrics, [row], now)
    notifier.notify([stream_key(invocation_id)])
    counted()
    return to_json(row)


async def fail(
    store: Store,
    notifier: Notifier,
    caller: Principal,
    worker_id: str,
    invocation_id: str,
    error: dict[str, Any],
    *,
    retry: bool,
    now: datetime,
    metrics: Metrics | None = None,
) -> dict[str, Any]:
    async with store.write() as conn:
        worker = await _worker_in(conn, caller, worker_id)
        row = await lease_store.fail(conn, invocation_id, worker.id, error, retry=retry, now=now)
        woken = [stream_key(invocation_id)]
        if row is not None and row["state"] == "pending":
            # a retry wakes the queue's waiting claims, to wait for its backoff's end
            woken.append(row["queue_id"])
        if row is not None:
            await wakeups.publish(conn, woken)
        counted = await _count_ended(conn, metrics, [row] if row is not None else [], now)
    if row is None:
        raise _not_held(invocation_id)
    notifier.notify(woken)
    counted()
    return to_json(row)


async def _count_ended(
    conn: AsyncConnection, metrics: Metrics | None, rows: Sequence[RowMapping], now: datetime
) -> Callable[[], None]:
    """What to count once the transaction that recorded ``rows`` (each an attempt's
    outcome: the invocation as it is now, its ``started_at`` that attempt's) commits."""
    if metrics is None or not rows:
        return lambda: None
    labels = await metrics.queue_names(conn, [row["queue_id"] for row in rows])
    ended = [
        (labels[r["queue_id"]], r["state"], r["started_at"])
        for r in rows
        if r["queue_id"] in labels
    ]

    def count() -> None:
        metrics.ended_many(ended, now)

    return count


async def bye(
    store: Store, notifier: Notifier, caller: Principal, worker_id: str, now: datetime
) -> dict[str, Any]:
    """A worker leaving: its row goes (it may say hello again) and whatever it still holds
    is handed back to its queue at once, without spending an attempt."""
    worker = await _worker(store, caller, worker_id)
    async with store.write() as conn:
        queue_ids = await lease_store.hand_back(conn, worker.id, now)
        await worker_store.remove(conn, worker.id)
        await wakeups.publish(conn, queue_ids)
    notifier.notify(queue_ids)
    return {"released": len(queue_ids)}


async def report(
    store: Store,
    notifier: Notifier,
    caller: Principal,
    worker_id: str,
    reports: Sequence[Report],
    refused: Mapping[str, dict[str, str]],
    *,
    claim: int,
    now: datetime,
    lease_s: float = LEASE_S,
    metrics: Metrics | None = None,
) -> dict[str, Any]:
    """Many outcomes and (``claim`` > 0) a claim of up to that many more without waiting,
    in one transaction: a busy daemon's one round trip per batch. ``refused`` are the
    items the route turned away (too large, not storable), answered as such. A worker
    retired meanwhile gets its outcomes recorded and nothing more (``retired``)."""
    claimed: list[dict[str, Any]] = []
    retired = False
    expired: dict[str, int] = {}
    async with store.write() as conn:  # the outcomes and the claim: one transaction
        worker = await _worker_in(conn, caller, worker_id)
        # the worker's row first, then its invocations': the order a heartbeat takes
        # them in, so the two cannot deadlock on PostgreSQL
        seen = await worker_store.touch(conn, worker.id, now) if claim > 0 else None
        held: dict[str, tuple[str, datetime | None]] = {}
        states = await lease_store.report(conn, worker.id, reports, now, held_rows=held)
        retried = {held[i][0] for i, state in states.items() if state == "pending"}
        woken = [*(stream_key(i) for i in states), *sorted(retried)]  # as fail's
        await wakeups.publish(conn, woken)
        labels = (
            {} if metrics is None else await metrics.queue_names(conn, {held[i][0] for i in states})
        )
        if claim > 0:
            try:
                attempt = await claims.claim_in(
                    conn, worker, worker.reach, claim, now, lease_s, seen=seen, expired=expired
                )
                claimed, retired = attempt.claimed, attempt.retiring
            except (Gone, NotFound):  # raised before it wrote: the outcomes still commit
                retired = True
    notifier.notify(woken)
    if metrics is not None:
        metrics.ended_many(
            (
                (labels[held[i][0]], new_state, held[i][1])
                for i, new_state in states.items()
                if held[i][0] in labels
            ),
            now,
        )
    await _count_leased(store, metrics, worker.namespace_id, claimed)
    await _count_expired(store, metrics, expired)
    answers: list[dict[str, Any]] = []
    for item in reports:
        if item.invocation_id in states:
            answers.append({"id": item.invocation_id, "state": states[item.invocation_id]})
        else:
            not_held = str(_not_held(item.invocation_id))
            answers.append({"id": item.invocation_id, "refused": "not_held", "message": not_held})
    answers += [{"id": i, **refusal} for i, refusal in refused.items()]
    return {"results": answers, "invocations": claimed, "retired": retired}


def _not_held(invocation_id: str) -> Conflict:
    return Conflict(
        f'this worker does not hold invocation "{invocation_id}" (lease lost, cancelled or '
        "finished); nothing was changed",
        field="invocation",
    )
