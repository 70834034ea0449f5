"""What one controller tick reads and writes, in a fixed number of queries.

Whatever the number of queues, a tick reads: the active queues (with their namespaces),
pending and running counts per queue, every subscribed worker with its running count,
the in-flight launches and the persisted counters; and writes its audit rows and counters
in one batch each. No query is issued per queue.
"""

from __future__ import annotations

import functools
import json
from collections import defaultdict
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    RowMapping,
    Select,
    Text,
    bindparam,
    cast,
    delete,
    func,
    insert,
    literal_column,
    or_,
    select,
    tuple_,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from lakeshore.domain.fleet import WorkerView
from lakeshore.domain.queue import Queue
from lakeshore.domain.scaling import Counters
from lakeshore.elasticity import estimates
from lakeshore.elasticity.estimates import History
from lakeshore.elasticity.snapshot import Key, Snapshot
from lakeshore.elasticity.units import distinct_workers, scope_of
from lakeshore.store import claimable, history
from lakeshore.store import launches as launch_rows
from lakeshore.store.rows import queue_from_row
from lakeshore.store.tables import (
    controller_state,
    elasticity_events,
    invocations,
    namespaces,
    providers,
    queues,
    retired_workers,
    worker_queues,
    workers,
)

INV = invocations.c
W = workers.c
PART_ROWS = 2_000  # rows decoded between two turns of the event loop


class QueueCache:
    """Parsed queues by id, each with the ``revision`` it was parsed at.

    A steady tick reads every active queue's id and revision (which every write of its
    spec or state moves), and parses only those whose revision moved: the rows of
    10,000 unchanged queues are neither fetched whole nor validated again."""

    def __init__(self) -> None:
        self.by_id: dict[str, tuple[int, Queue]] = {}


TICK_ORDER = (queues.c.namespace_id, queues.c.created_at, queues.c.name)
WHOLE_READ = 500  # more changed queues than this: one read of them all, not a list of ids


async def active_queues(
    conn: AsyncConnection,
    node_id: str | None,
    *,
    unpinned: bool = True,
    cache: QueueCache | None = None,
) -> list[tuple[str, Queue]]:
    """Active queues this server ticks: unpinned ones (when ``unpinned``), and those pinned
    to ``node_id`` (when given). With a ``cache``, only queues changed since it was filled
    are read whole (in one more query); the cache then holds exactly these queues."""
    ticked: list[ColumnElement[bool]] = []
    if unpinned:
        ticked.append(queues.c.server_node_id.is_(None))
    if node_id is not None:
        ticked.append(queues.c.server_node_id == node_id)
    if not ticked:
        return []
    where = (queues.c.state == "active", or_(*ticked))
    if cache is not None:
        return await _through_cache(conn, where, cache)
    whole = (
        select(queues, namespaces.c.name.label("namespace_name"))
        .join(namespaces, namespaces.c.id == queues.c.namespace_id)
        .where(*where)
        .order_by(*TICK_ORDER)
    )
    found: list[tuple[str, Queue]] = []
    async for rows in _in_parts(conn, whole):
        found += [(row["namespace_name"], queue_from_row(row)) for row in rows]
    return found


async def _through_cache(
    conn: AsyncConnection, where: tuple[ColumnElement[bool], ...], cache: QueueCache
) -> list[tuple[str, Queue]]:
    light = (
        select(
            queues.c.id,
            queues.c.revision,
            namespaces.c.name.label("namespace_name"),
        )
        .join(namespaces, namespaces.c.id == queues.c.namespace_id)
        .where(*where)
        .order_by(*TICK_ORDER)
    )
    listed: list[tuple[str, str, int]] = []
    async for rows in _in_parts(conn, light):
        listed += [(r["id"], r["namespace_name"], r["revision"]) for r in rows]
    old = cache.by_id
    changed = {qid for qid, _, version in listed if qid not in old or old[qid][0] != version}
    fresh: dict[str, tuple[int, Queue]] = {}
    if changed:
        query = select(queues).where(*where)
        if len(changed) <= WHOLE_READ:
            query = query.where(queues.c.id.in_(sorted(changed)))
        async for rows in _in_parts(conn, query):
            fresh.update(
                (r["id"], (r["revision"], queue_from_row(r))) for r in rows if r["id"] in changed
            )
    by_id: dict[str, tuple[int, Queue]] = {}
    found = []
    for qid, ns_name, _ in listed:
        if qid in fresh:
            by_id[qid] = fresh[qid]
            queue = fresh[qid][1]
        elif qid not in changed:
            by_id[qid] = old[qid]
            queue = old[qid][1]
        else:  # changed again between the two reads (paused, say): the next tick sees it
            continue
        found.append((ns_name, queue))
    cache.by_id = by_id
    return found


async def _in_parts(conn: AsyncConnection, query: Any) -> AsyncIterator[Sequence[RowMapping]]:
    """A large result in parts of ``PART_ROWS``: each part is fetched with an ``await``, so
    the event loop serves requests between parts rather than waiting for every row of a
    10,000-queue snapshot to be decoded."""
    result = await conn.stream(query, execution_options={"yield_per": PART_ROWS})
    try:
        async for part in result.mappings().partitions(PART_ROWS):
            yield part
    finally:
        await result.close()  # a reader that stops early leaves no cursor open


async def _counts(
    conn: AsyncConnection, state: str, now: datetime, queue_ids: Sequence[str] | None = None
) -> dict[str, int]:
    # pending: a delayed submit not due yet is scheduled, not demand (store/claimable.py)
    counted = claimable.waiting(now) if state == "pending" else INV.state == state
    query = select(INV.queue_id, func.count()).where(counted).group_by(INV.queue_id)
    if queue_ids is not None:
        query = query.where(INV.queue_id.in_(queue_ids))
    return {queue_id: int(n) for queue_id, n in (await conn.execute(query)).all()}


async def _workers(
    conn: AsyncConnection, queue_ids: Sequence[str] | None = None
) -> tuple[dict[str, list[WorkerView]], dict[str, int]]:
    """The subscribed workers (retiring ones left out) of ``queue_ids`` (every queue's
    when ``None``) by queue, and each one's capacity."""
    if queue_ids is not None and not queue_ids:
        return {}, {}
    running = (
        select(INV.worker_id, func.count().label("n"))
        .where(INV.state == "running")
        .group_by(INV.worker_id)
        .subquery()
    )
    query = (
        select(
            worker_queues.c.queue_id,
            W.id,
            cast(W.tags, Text).label("tags"),  # parsed once per distinct list, below
            W.cost_weight,
            W.current_invocations,
            W.last_seen_at,
            W.max_invocations,
            func.coalesce(running.c.n, 0).label("running"),
        )
        .select_from(
            worker_queues.join(workers, W.id == worker_queues.c.worker_id).outerjoin(
                running, running.c.worker_id == W.id
            )
        )
        .where(W.retiring.is_(False))
    )
    if queue_ids is not None:
        query = query.where(_id_in(worker_queues.c.queue_id, queue_ids, conn.dialect.name))
    by_queue: dict[str, list[WorkerView]] = defaultdict(list)
    capacity: dict[str, int] = {}
    result = await conn.stream(query, execution_options={"yield_per": PART_ROWS})
    try:
        async for part in result.partitions(PART_ROWS):  # plain tuples: the hot loop
            for queue_id, wid, tags, weight, current, seen, most, running_n in part:
                by_queue[queue_id].append(
                    WorkerView(
                        id=wid,
                        tags=_tags(tags),
                        cost_weight=weight,
                        current_invocations=current,
                        running=int(running_n),
                        last_seen_at=seen,
                    )
                )
                capacity[wid] = int(most)
    finally:
        await result.close()
    return dict(by_queue), capacity


async def headcount(
    conn: AsyncConnection, queue_ids: Sequence[str] | None = None
) -> dict[str, tuple[int, int]]:
    """Per queue (of ``queue_ids``, or every one), its subscribed workers (retiring ones
    left out) and their capacity: counted by the database, one row per queue."""
    query = (
        select(worker_queues.c.queue_id, func.count(), func.sum(W.max_invocations))
        .select_from(worker_queues.join(workers, W.id == worker_queues.c.worker_id))
        .where(W.retiring.is_(False))
        .group_by(worker_queues.c.queue_id)
    )
    if queue_ids is not None:
        query = query.where(worker_queues.c.queue_id.in_(queue_ids))
    rows = (await conn.execute(query)).all()
    return {queue_id: (int(n), int(most or 0)) for queue_id, n, most in rows}


async def workers_of(
    conn: AsyncConnection, queue_ids: Sequence[str]
) -> dict[str, list[WorkerView]]:
    """The workers of ``queue_ids``, for the victims of a plan's scale-downs."""
    by_queue, _ = await _workers(conn, queue_ids)
    return by_queue


@functools.lru_cache(maxsize=4096)
def _tags(stored: str | None) -> tuple[str, ...]:
    """A worker's stored tag list: fleets share a few lists, each parsed once."""
    return tuple(json.loads(stored) or ()) if stored else ()


async def load_counters(
    conn: AsyncConnection, namespace_id: str | None = None
) -> dict[tuple[str, str], Counters]:
    s = controller_state.c
    query = select(s.namespace_id, s.scope, s.consecutive_above, s.consecutive_below)
    if namespace_id is not None:
        query = query.where(s.namespace_id == namespace_id)
    return {
        (ns, scope): Counters(above=int(above), below=int(below))
        for ns, scope, above, below in (await conn.execute(query)).all()
    }


async def snapshot(
    conn: AsyncConnection,
    node_id: str | None,
    *,
    now: datetime,
    unpinned: bool = True,
    cache: QueueCache | None = None,
) -> Snapshot:
    """Everything a tick plans from, in a fixed number of queries. Standalone queues'
    fleets are counted by the database (``headcount``); only pools' members have their
    workers listed, since a pool counts a worker subscribed to two members once."""
    ticked = await active_queues(conn, node_id, unpinned=unpinned, cache=cache)
    learning = history.learning(ticked)
    pooled = [q.id for _, q in ticked if q.spec.elasticity and q.spec.elasticity.pool]
    pooled += [q.id for members in learning.values() for q in members]  # idle times
    by_queue, capacity = await _workers(conn, sorted(set(pooled)))
    return Snapshot(
        queues=ticked,
        pending=await _counts(conn, "pending", now),
        running=await _counts(conn, "running", now),
        workers=by_queue,
        capacity=capacity,
        counters=await load_counters(conn),
        in_flight=await launch_rows.in_flight_by_scope(conn, None, now),
        headcount=await headcount(conn),
        history=await _histories(conn, learning, by_queue, now),
    )


async def _histories(
    conn: AsyncConnection,
    learning: dict[Key, list[Queue]],
    by_queue: dict[str, list[WorkerView]],
    now: datetime,
) -> dict[Key, History]:
    """The recent history of each scope whose policy learns from it (``wait_target``),
    with the ``boot_s`` its provider's registration configures (read in one query)."""
    named = {key: history.provider_of(members) for key, members in learning.items()}
    wanted = {(key[0], name) for key, name in named.items() if name is not None}
    found = await registrations(conn, wanted)
    histories = {}
    for key, members in learning.items():
        row = found.get((key[0], named[key] or ""))
        configured = estimates.configured_boot_s(row["config"]) if row is not None else None
        fleet = distinct_workers(members, by_queue)
        histories[key] = await history.history_of(conn, key, members, fleet, now, configured)
    return histories


async def snapshot_of(
    conn: AsyncConnection,
    namespace_id: str,
    queues: Sequence[tuple[str, Queue]],
    scope: str,
    now: datetime,
) -> Snapshot:
    """What :func:`snapshot` reads, for ``queues`` of one namespace only (one queue, or a
    pool's members): the same reads, so ``stats`` and ``explain`` see what a tick sees."""
    ids = [queue.id for _, queue in queues]
    by_queue, capacity = await _workers(conn, ids)
    return Snapshot(
        queues=list(queues),
        pending=await _counts(conn, "pending", now, ids),
        running=await _counts(conn, "running", now, ids),
        workers=by_queue,
        capacity=capacity,
        counters=await load_counters(conn, namespace_id),
        in_flight=await launch_rows.in_flight_by_scope(conn, [(namespace_id, scope)], now),
        history=await _histories(conn, history.learning(queues), by_queue, now),
    )


async def scopes_at_zero(
    conn: AsyncConnection, queue_ids: Sequence[str], kinds: Sequence[str], now: datetime
) -> set[Key]:
    """The scopes (namespace id, queue name or ``pool:<name>``) of the active queues of
    ``queue_ids`` whose policy is one of ``kinds`` (without a custom scaler) and whose
    scope has no daemon and no launch in flight."""
    query = select(queues).where(queues.c.id.in_(queue_ids), queues.c.state == "active")
    found = [queue_from_row(row) for row in (await conn.execute(query)).mappings()]
    wanted = {
        (q.namespace_id, scope_of(q)): q
        for q in found
        if q.spec.elasticity is not None
        and q.spec.elasticity.kind in kinds
        and q.spec.custom_scaler_udf is None
    }
    if not wanted:
        return set()
    flying = await launch_rows.in_flight_by_scope(conn, list(wanted), now)
    fleets = await headcount(conn, [q.id for q in wanted.values()])
    return {
        key
        for key, q in wanted.items()
        if not flying.get(key) and (key[1].startswith("pool:") or not fleets.get(q.id, (0, 0))[0])
    }


async def save_counters(
    conn: AsyncConnection, values: dict[tuple[str, str], Counters], now: datetime
) -> None:
    """Upsert the counters that changed (zeroed counters are deleted: the default)."""
    s = controller_state.c
    zero = [key for key, c in values.items() if c == Counters()]
    rows = [
        {
            "namespace_id": ns,
            "scope": scope,
            "consecutive_above": c.above,
            "consecutive_below": c.below,
            "updated_at": now,
        }
        for (ns, scope), c in values.items()
        if c != Counters()
    ]
    if zero:  # one statement, however many queues went back to zero
        await conn.execute(
            delete(controller_state).where(tuple_(s.namespace_id, s.scope).in_(sorted(zero)))
        )
    if rows:
        dialect_insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
        stmt = dialect_insert(controller_state)
        stmt = stmt.on_conflict_do_update(
            index_elements=["namespace_id", "scope"],
            set_={
                "consecutive_above": stmt.excluded.consecutive_above,
                "consecutive_below": stmt.excluded.consecutive_below,
                "updated_at": stmt.excluded.updated_at,
            },
        )
        await conn.execute(stmt, rows)


async def reset_counters(conn: AsyncConnection, namespace_id: str, scopes: Sequence[str]) -> None:
    """Zero the hysteresis counters of ``scopes`` (a queue's name, a ``pool:<name>``)."""
    s = controller_state.c
    await conn.execute(
        delete(controller_state).where(s.namespace_id == namespace_id, s.scope.in_(scopes))
    )


async def write_events(conn: AsyncConnection, rows: Sequence[dict[str, Any]]) -> list[int]:
    """Insert audit rows; their ids, in order."""
    if not rows:
        return []
    e = elasticity_events.c
    query = insert(elasticity_events).returning(e.id, sort_by_parameter_order=True)
    return [int(i) for i in (await conn.execute(query, list(rows))).scalars()]


def _id_in(column: ColumnElement[Any], ids: Sequence[Any], dialect: str) -> ColumnElement[bool]:
    """``column IN ids`` as one bound value however many ids (a list of 10,000 binds
    costs more to compile than to run): an array on PostgreSQL, JSON on SQLite. The ids
    are all numbers or all strings."""
    if dialect == "postgresql":
        kind = Text if ids and isinstance(ids[0], str) else BigInteger
        ids_array = bindparam("ids", list(ids), type_=postgresql.ARRAY(kind))
        return column == func.any(ids_array)
    listed: Select[tuple[Any]] = select(literal_column("value")).select_from(
        func.json_each(bindparam("ids", json.dumps(list(ids)), type_=Text))
    )
    return column.in_(listed.scalar_subquery())


async def fold_events(conn: AsyncConnection, ids: Sequence[int], now: datetime) -> set[int]:
    """One more tick for each of the no-op rows ``ids`` (``repeats + 1``, ``last_at``):
    only rows still the latest of their scope are folded into (a row another writer
    followed, or one pruned, is not). The ids folded into."""
    if not ids:
        return set()
    e = elasticity_events.c
    later = elasticity_events.alias("later")
    newer = (
        select(later.c.id)
        .where(
            later.c.namespace_id == e.namespace_id,
            later.c.queue_name == e.queue_name,
            later.c.id > e.id,
        )
        .exists()
    )
    query = (
        update(elasticity_events)
        .where(_id_in(e.id, ids, conn.dialect.name), e.action == "tick_noop", ~newer)
        .values(repeats=e.repeats + 1, last_at=now)
        .returning(e.id)
    )
    return {int(i) for i in (await conn.execute(query)).scalars()}


async def retire_if_idle(conn: AsyncConnection, worker_id: str) -> str:
    """Mark the worker retiring if it holds no running invocation: 'retiring', 'busy' or
    'gone'. The worker's row is locked first, so a claim in progress finishes before the
    check (and a later claim sees ``retiring`` and takes nothing)."""
    lock = select(W.id, W.retiring).where(W.id == worker_id)
    if conn.dialect.name == "postgresql":
        lock = lock.with_for_update()
    row = (await conn.execute(lock)).first()
    if row is None:
        return "gone"
    busy = select(func.count()).where(INV.worker_id == worker_id, INV.state == "running")
    if int((await conn.execute(busy)).scalar_one()) > 0:
        return "busy"
    await conn.execute(update(workers).where(W.id == worker_id).values(retiring=True))
    return "retiring"


async def unretire(conn: AsyncConnection, worker_id: str) -> None:
    await conn.execute(update(workers).where(W.id == worker_id).values(retiring=False))


async def retire(
    conn: AsyncConnection, worker_id: str, namespace_id: str, reason: str, now: datetime
) -> None:
    """The worker's row goes and its id is refused at hello in its namespace from now on."""
    gone = await conn.execute(delete(workers).where(W.id == worker_id).returning(W.name))
    name = gone.scalar_one_or_none() or worker_id
    dialect_insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
    await conn.execute(
        dialect_insert(retired_workers)
        .values(id=worker_id, namespace_id=namespace_id, name=name, retired_at=now, reason=reason)
        .on_conflict_do_nothing()
    )


async def registrations(
    conn: AsyncConnection, keys: set[tuple[str, str]]
) -> dict[tuple[str, str], RowMapping]:
    """Provider registrations by (namespace id, name), in one query."""
    if not keys:
        return {}
    p = providers.c
    query = select(providers).where(tuple_(p.namespace_id, p.name).in_(sorted(keys)))
    return {
        (row["namespace_id"], row["name"]): row for row in (await conn.execute(query)).mappings()
    }


async def registration(conn: AsyncConnection, namespace_id: str, name: str) -> RowMapping | None:
    p = providers.c
    query = select(providers).where(p.namespace_id == namespace_id, p.name == name)
    return (await conn.execute(query)).mappings().first()
