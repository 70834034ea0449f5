"""Invocation rows: batch submit with idempotency keys, reads, batch claims, expiry of
overdue work. What a worker then holds (leases, outcomes, the reaper) is in
``lakeshore.store.leases``.

Claims are one ``SELECT … LIMIT n`` and one ``UPDATE … RETURNING`` per queue, whatever
``n`` is. On PostgreSQL the select takes ``FOR UPDATE SKIP LOCKED``, so servers sharing a
database never hand one invocation to two workers; on SQLite the write transaction
(``BEGIN IMMEDIATE``) already serializes claimers.
"""

from __future__ import annotations

import functools
import logging
import operator
import random
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from functools import partial
from typing import Any

import orjson
from sqlalchemy import (
    ARRAY,
    ColumnElement,
    Float,
    RowMapping,
    Text,
    and_,
    any_,
    bindparam,
    case,
    cast,
    delete,
    exists,
    func,
    literal,
    literal_column,
    or_,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.dialects.sqlite import dialect as sqlite_dialect
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.selectable import TextualSelect

from lakeshore.domain import disciplines, jsonsafe
from lakeshore.store import claimable, tallies, wakeups
from lakeshore.store.driver import psycopg_of, psycopg_text
from lakeshore.store.isolated import isolated
from lakeshore.store.statements import OneStatement, Parameters, Statements
from lakeshore.store.tables import DEFERRED, invocations, queues, stream_items

C = invocations.c
log = logging.getLogger("lakeshore.store")

_ORDER: dict[str, tuple[ColumnElement[Any], ...]] = {
    "fifo": (C.created_at, C.id),
    "filo": (C.created_at.desc(), C.id.desc()),
    "priority": (C.priority.desc(), C.created_at, C.id),
    "boltzmann": (C.priority.desc(), C.created_at, C.id),
}
_RNG = random.Random()


# ``_ORDER`` in Python, for rows a statement returned in no particular order
def _in_order(kind: str, rows: Sequence[RowMapping]) -> list[RowMapping]:
    if kind == "priority":
        return sorted(rows, key=lambda r: (-r["priority"], r["created_at"], r["id"]))
    return sorted(rows, key=lambda r: (r["created_at"], r["id"]), reverse=kind == "filo")


def _is_pg(conn: AsyncConnection) -> bool:
    return conn.dialect.name == "postgresql"


# The columns a submit writes. One submit's rows share a queue (and what goes with it);
# each has its own of the rest, its PostgreSQL type given here. ``created_at`` is the
# first row's plus ``us`` microseconds. The other columns start NULL (worker, lease,
# outcome, start and end times).
SHARED = ("namespace_id", "queue_id", "queue_name", "state", "attempts", "available_at")
OWN = {
    "id": "text",
    "fn": "text",
    "args": "text",  # JSON text, cast to json: kept exactly as written
    "kwargs": "text",
    "priority": "float8",
    "key": "text",
    "max_attempts": "int4",
    "timeout_s": "float8",
    "retry": "text",  # the effective retry policy as JSON text; null: the default
    "concurrency_key": "text",
}
_UNSET = {
    column.name: None
    for column in invocations.c
    if column.name not in (*SHARED, *OWN, "created_at")
}
_JSON_COLUMNS = ("args", "kwargs", "retry")
_SHARED_OF = operator.itemgetter(*SHARED)  # a row's shared columns, as one tuple
_OWN_OF = operator.itemgetter(*OWN)  # and its own
# the conflict target of a key: the unique index holds only rows with one (0007), and
# both stores match a partial index only when its predicate is named
ON_KEY = "(queue_id, key) WHERE key IS NOT NULL"
_MICROSECOND = timedelta(microseconds=1)


# A batch goes in as one JSON document, an array of rows holding only their own columns,
# in one statement of fixed text that returns only the ids it inserted. A multi-row
# VALUES list of ~15,000 parameters for 1,000 rows cost more to build and parse than the
# insert took; one array parameter per column (``unnest``) was dumped element by element
# by the driver, in Python, and every column read back: the rows are known here already,
# so only which ones went in is asked.
def _insert_document(dialect: str, *, guarded: bool = False) -> TextualSelect:
    """The insert; ``guarded``, it inserts only while the queue row is at ``:revision``
    (and holds that row, shared, until it commits, as a change of the queue would)."""
    names = ", ".join(f'"{name}"' for name in (*OWN, *SHARED, "created_at"))
    shared = ", ".join(f":{name}" for name in SHARED)
    if dialect == "postgresql":
        own = ", ".join(
            f'u."{name}"::json' if name in _JSON_COLUMNS else f'u."{name}"' for name in OWN
        )
        created = "CAST(:created_at AS timestamptz) + u.us * interval '1 microsecond'"
        shape = ", ".join(f'"{name}" {kind}' for name, kind in {**OWN, "us": "int8"}.items())
        source = f"json_to_recordset(CAST(:rows AS json)) AS u({shape})"
        if guarded:
            source += ", queue"
    else:  # SQLite: the JSON functions are built in; WHERE true parses the upsert after it
        own = ", ".join(f"json_extract(value, '$.{name}')" for name in OWN)
        created = "json_extract(value, '$.created_at')"  # as the column's type writes it
        source = "json_each(:rows) WHERE true"
        if guarded:
            source = f"json_each(:rows) WHERE EXISTS (SELECT 1 FROM queues WHERE {_AT})"
    sql = (
        f"INSERT INTO invocations ({names}) SELECT {own}, {shared}, {created} FROM {source} "
        f"ON CONFLICT {ON_KEY} DO NOTHING RETURNING id"
    )
    if dialect == "postgresql":
        # the queue's wake-up, in the same statement (one round trip less a submit): sent
        # once, when the transaction commits, and only when a row went in
        sql = (
            f"WITH inserted AS ({sql}), woken AS (SELECT pg_notify(:channel, :queue_id) "
            "FROM (SELECT 1 FROM inserted LIMIT 1) AS any_row) "
            "SELECT id FROM inserted, (SELECT count(*) FROM woken) AS once"
        )
        if guarded:
            queue = f"queue AS (SELECT 1 FROM queues WHERE {_AT} FOR SHARE)"
            sql = sql.replace("WITH ", f"WITH {queue}, ", 1)
    times = [bindparam(name, type_=C[name].type) for name in ("available_at", "created_at")]
    return text(sql).bindparams(*times[: 2 if dialect == "postgresql" else 1]).columns(C.id)


_AT = "id = :queue_id AND revision = :revision"  # the queue row, as a submit last saw it
_INSERT = {dialect: _insert_document(dialect) for dialect in ("postgresql", "sqlite")}
_INSERT_GUARDED = {
    dialect: _insert_document(dialect, guarded=True) for dialect in ("postgresql", "sqlite")
}


def json_text(value: Any) -> str:
    """``value`` as compact JSON text (what the store keeps of args and kwargs, which
    were found storable as they came in)."""
    if not value:  # the common [] and {}
        return "[]" if isinstance(value, list) else "{}"
    return jsonsafe.stored(value).decode()


def _json_or_null(value: Any) -> str | None:
    """A JSON column's text (None, SQL's null, for a column left empty: a retry policy
    that is the default)."""
    return None if value is None else json_text(value)


Stamp = Callable[[datetime], Any]


def _sqlite_stamp(dialect: Dialect) -> Stamp:
    """A time as SQLite's column keeps it (text of a fixed width), for a JSON document of
    rows, as the column's type writes it."""
    stamp = C.created_at.type.dialect_impl(dialect).bind_processor(dialect)
    assert stamp is not None, "SQLite keeps a time as the text its type writes"
    return stamp


def _parameters(rows: Sequence[dict[str, Any]], stamp: Stamp | None) -> dict[str, Any]:
    """The statement's parameters: the shared columns, and the rows' own as JSON text
    (args and kwargs as JSON text of their own). Each row's time is its offset from the
    first row's (PostgreSQL's statement adds it), or, with ``stamp`` (SQLite, which
    keeps times as text in the column type's own format), the time ``stamp`` writes."""
    first = rows[0]
    alike = _SHARED_OF(first)
    shared = dict(zip(SHARED, alike, strict=True))
    if any(_SHARED_OF(row) != alike for row in rows):
        raise ValueError(f"the rows of one insert share {', '.join(SHARED)}")
    base = first["created_at"]
    items, parameters = [], {**shared, "created_at": base}
    for row in rows:
        item = dict(zip(OWN, _OWN_OF(row), strict=True))
        # args are a list and kwargs a dict (mostly empty), a retry policy mostly None
        args, kwargs, retry = item["args"], item["kwargs"], item["retry"]
        item["args"] = json_text(args) if args else "[]"
        item["kwargs"] = json_text(kwargs) if kwargs else "{}"
        if retry is not None:
            item["retry"] = json_text(retry)
        if stamp is None:
            item["us"] = (row["created_at"] - base) // _MICROSECOND
        else:
            item["created_at"] = stamp(row["created_at"])
        items.append(item)
    if stamp is None:
        parameters["channel"] = wakeups.CHANNEL
    else:
        del parameters["created_at"]  # in the rows
    return {**parameters, "rows": orjson.dumps(items).decode()}


def _rows_at(stamp: Stamp | None, given: Parameters) -> Parameters:
    """:data:`_SUBMIT`'s parameters, from ``rows`` and ``revision``."""
    return {**_parameters(given["rows"], stamp), "revision": given["revision"]}


# a submit decided on a copy of its queue: one statement, its own transaction
_SUBMIT = OneStatement(
    "submit",
    postgresql=_INSERT_GUARDED["postgresql"],
    sqlite=_INSERT_GUARDED["sqlite"],
    for_postgresql=partial(_rows_at, None),
    for_sqlite=partial(_rows_at, _sqlite_stamp(sqlite_dialect())),
)


async def insert_many(
    conn: AsyncConnection, rows: Sequence[dict[str, Any]]
) -> list[dict[str, Any] | RowMapping]:
    """Insert ``rows`` (each with the :data:`SHARED` and :data:`OWN` columns and
    ``created_at``; the shared ones alike in all); a row whose (queue, key) exists is not
    inserted. When any row goes in, the queue's wake-up is published with it (see
    :mod:`lakeshore.store.wakeups`). Returns, for each row in order, the stored row:
    the row given, with the columns a submit leaves NULL, or the one that already held
    its key (read back: only rows whose key was taken cost a read)."""
    if not rows:
        return []
    if any(row["available_at"] != rows[0]["available_at"] for row in rows):
        return await _insert_by_due_time(conn, rows)
    pg = _is_pg(conn)
    stamp = None if pg else _sqlite_stamp(conn.dialect)
    statement = _INSERT["postgresql" if pg else "sqlite"]
    inserted = set((await conn.execute(statement, _parameters(rows, stamp))).scalars())
    by_key: dict[tuple[str, str], dict[str, Any] | RowMapping] = {}
    stored: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row["id"] in inserted:
            stored[row["id"]] = full = {**row, **_UNSET}
            if row["key"] is not None:
                by_key[(row["queue_id"], row["key"])] = full
    taken = {
        (row["queue_id"], row["key"])
        for row in rows
        if row["id"] not in inserted and (row["queue_id"], row["key"]) not in by_key
    }
    if taken:
        # the rows share their queue: (queue, key) pairs would be a row-value IN, which
        # SQLite answers with a scan of the table
        keys = sorted(key for _, key in taken)
        query = select(invocations).where(C.queue_id == rows[0]["queue_id"], C.key.in_(keys))
        for found in (await conn.execute(query)).mappings():
            by_key[(found["queue_id"], found["key"])] = found
    return [
        stored[row["id"]] if row["id"] in inserted else by_key[(row["queue_id"], row["key"])]
        for row in rows
    ]


async def _insert_by_due_time(
    conn: AsyncConnection, rows: Sequence[dict[str, Any]]
) -> list[dict[str, Any] | RowMapping]:
    """:func:`insert_many` of a batch whose rows fall due at different times (delayed
    submits): one statement per due time, each with its rows in order. A key the batch
    repeats across two of them is found taken by the later one, as within one."""
    by_due: dict[datetime, list[dict[str, Any]]] = {}
    for row in rows:
        by_due.setdefault(row["available_at"], []).append(row)
    stored: dict[str, dict[str, Any] | RowMapping] = {}
    for group in by_due.values():
        for row, kept in zip(group, await insert_many(conn, group), strict=True):
            stored[row["id"]] = kept
    return [stored[row["id"]] for row in rows]


async def insert_at(
    conn: Statements, rows: Sequence[dict[str, Any]], revision: int
) -> list[dict[str, Any]] | None:
    """Insert ``rows`` (as :func:`insert_many` takes them, falling due together; a key
    on one row at most) only while their queue's row is at ``revision``, with its
    wake-up; one statement. Returns the stored rows, or ``None`` when nothing went in:
    the queue moved on (or is gone), or the one row's key is taken. What a submit
    decided from a copy of the queue holds only while the queue is still that copy;
    the caller then takes the full path, which reads the queue."""
    if len(rows) > 1 and any(row["key"] is not None for row in rows):
        raise ValueError("a batch with keys goes the full way (a key taken is read back)")
    inserted = await conn.fetch(_SUBMIT, {"rows": rows, "revision": revision})
    if not inserted:
        return None
    assert len(inserted) == len(rows), "rows without keys go in together or not at all"
    return [{**row, **_UNSET} for row in rows]


# A submit handed to a claim that waits in this server (services/taskqueue/handoff.py): the row
# goes in leased to that worker when, at the statement's own moment, the worker may
# take it as a claim would (store/claimable.py's rule, asked of the row about to go in,
# its columns this statement's parameters: due now, not delayed; the queue dispatching;
# the worker subscribed and running fewer than it may hold), its row not retiring and
# not held by another transaction (SKIP LOCKED: a claim or a retirement under way, and
# the row goes in pending), and nothing claimable in the queue to take first (the same
# rule, asked of the stored rows), and the queue's running limits leave room for it
# (claimable.within_limits: counted on SQLite; on PostgreSQL, whose statement cannot
# take the queue's limit lock before its snapshot, a limited queue hands nothing and
# the row goes in pending for a claim, which counts under the lock). On PostgreSQL the
# worker's row is locked within the statement, whose reads keep the snapshot taken at
# its start: a claim that committed between that snapshot and the lock would go
# uncounted, so the lock's version of the row must be the snapshot's (``xmin``, moved by
# every claim's touch). Otherwise it goes in pending, as any submit. Either way, the
# queue as the copy saw it (``revision``).
_HANDED_COLUMNS = (*OWN, *SHARED, "created_at", "worker_id", "started_at", "lease_expires_at")


def _worker_may_take(dialect: str) -> str:
    """The rule (:func:`claimable.may_take`) as this statement's text, for ``dialect``."""
    at = "CAST(:{} AS timestamptz)" if dialect == "postgresql" else ":{}"
    now: ColumnElement[Any] = literal_column(at.format("created_at"))
    queue_id: ColumnElement[Any] = literal_column(":queue_id")
    fresh = claimable.Candidate(
        state=claimable.PENDING,
        available_at=literal_column(at.format("available_at")),
        queue_id=queue_id,
    )
    taker = claimable.Taker(worker_id=literal_column(":worker_id"), holds=literal_column(":holds"))
    stored = claimable.Candidate(state=C.state, available_at=C.available_at, queue_id=queue_id)
    first = select(C.id).where(C.queue_id == queue_id, claimable.may_take(stored, now))
    pg = dialect == "postgresql"
    key: ColumnElement[Any] = literal_column(
        "CAST(:concurrency_key AS text)" if pg else ":concurrency_key"
    )
    limits = claimable.within_limits(
        queue_id,
        key,
        _admission(dialect, "max_running"),
        _admission(dialect, "max_running_per_key"),
        counted=not pg,
    )
    return claimable.as_text(and_(claimable.may_take(fresh, now, taker), limits, ~exists(first)))


def _admission(dialect: str, name: str) -> ColumnElement[Any]:
    """The queue's ``admission.<name>`` (null: not set), as this statement's text."""
    if dialect == "postgresql":
        value = f"CAST(admission->>'{name}' AS int8)"
    else:
        value = f"json_extract(admission, '$.{name}')"
    return literal_column(f"(SELECT {value} FROM queues WHERE id = :queue_id)")


def _handed_document(dialect: str) -> Any:
    names = ", ".join(f'"{name}"' for name in _HANDED_COLUMNS)
    if dialect == "postgresql":
        own = ", ".join(
            f"CAST(:{name} AS {'json' if name in _JSON_COLUMNS else kind})"
            for name, kind in OWN.items()
        )
        values = (
            f"{own}, :namespace_id, :queue_id, :queue_name,"
            " CASE WHEN h.yes THEN 'running' ELSE 'pending' END,"
            " CASE WHEN h.yes THEN 1 ELSE 0 END, :available_at, :created_at,"
            " CASE WHEN h.yes THEN CAST(:worker_id AS text) END,"
            " CASE WHEN h.yes THEN CAST(:created_at AS timestamptz) END,"
            " CASE WHEN h.yes THEN CAST(:lease_expires_at AS timestamptz) END"
        )
        sql = (
            f"WITH queue AS (SELECT 1 FROM queues WHERE {_AT} FOR SHARE),"
            " seen AS (SELECT xmin::text AS version FROM workers WHERE id = :worker_id),"
            " held AS (SELECT xmin::text AS version FROM workers"
            " WHERE id = :worker_id AND NOT retiring FOR UPDATE SKIP LOCKED),"
            # once, not once per CASE below
            " handed AS MATERIALIZED (SELECT EXISTS (SELECT 1 FROM held"
            f" JOIN seen USING (version) WHERE {_worker_may_take(dialect)}) AS yes),"
            f" inserted AS (INSERT INTO invocations ({names}) SELECT {values}"
            f" FROM queue, handed AS h ON CONFLICT {ON_KEY} DO NOTHING RETURNING state),"
            # a row handed on is no claim's to take: only a pending one wakes the queue
            " woken AS (SELECT pg_notify(:channel, :queue_id) FROM inserted"
            " WHERE state = 'pending')"
            " SELECT state FROM inserted, (SELECT count(*) FROM woken) AS once"
        )
        return text(sql).bindparams(
            *(bindparam(n, type_=C[n].type) for n in ("available_at", "created_at"))
        )
    own = ", ".join(f":{name}" for name in OWN)
    values = (
        f"{own}, :namespace_id, :queue_id, :queue_name,"
        " CASE WHEN h.yes THEN 'running' ELSE 'pending' END,"
        " CASE WHEN h.yes THEN 1 ELSE 0 END, :available_at, :created_at,"
        " CASE WHEN h.yes THEN :worker_id END,"
        " CASE WHEN h.yes THEN :created_at END,"
        " CASE WHEN h.yes THEN :lease_expires_at END"
    )
    sql = (  # SQLite: one writer at a time, so the conditions hold as they are read
        f"INSERT INTO invocations ({names}) SELECT {values} FROM (SELECT"
        " EXISTS (SELECT 1 FROM workers WHERE id = :worker_id AND NOT retiring)"
        f" AND {_worker_may_take(dialect)} AS yes) AS h"
        f" WHERE EXISTS (SELECT 1 FROM queues WHERE {_AT})"
        f" ON CONFLICT {ON_KEY} DO NOTHING RETURNING state"
    )
    times = ("available_at", "created_at", "lease_expires_at")
    return text(sql).bindparams(*(bindparam(n, type_=C[n].type) for n in times))


_HANDED = OneStatement(
    "submit_handed",
    postgresql=_handed_document("postgresql"),
    sqlite=_handed_document("sqlite"),  # takes no channel: nothing listens on SQLite
)


async def insert_one_handed(
    conn: Statements,
    row: dict[str, Any],
    revision: int,
    *,
    worker_id: str,
    holds: int,
    lease_s: float,
) -> dict[str, Any] | None:
    """:func:`insert_at` of one row, leasing it to ``worker_id`` (which may hold ``holds``
    at once) for ``lease_s`` when it may take it now (see above), pending otherwise:
    the stored row, or ``None`` when nothing went in."""
    now: datetime = row["created_at"]
    lease_expires_at = now + timedelta(seconds=lease_s)
    parameters = {name: row[name] for name in (*OWN, *SHARED, "created_at")}
    for name in _JSON_COLUMNS:
        parameters[name] = _json_or_null(parameters[name])
    parameters.update(
        revision=revision,
        worker_id=worker_id,
        holds=holds,
        lease_expires_at=lease_expires_at,
        channel=wakeups.CHANNEL,
    )
    found = await conn.fetch(_HANDED, parameters)
    if not found:
        return None
    stored = {**row, **_UNSET}
    if found[0][0] == "running":
        stored.update(
            state="running",
            attempts=1,
            worker_id=worker_id,
            started_at=now,
            lease_expires_at=lease_expires_at,
        )
    return stored


async def get(conn: AsyncConnection, namespace_id: str, invocation_id: str) -> RowMapping | None:
    query = select(invocations).where(C.namespace_id == namespace_id, C.id == invocation_id)
    return (await conn.execute(query)).mappings().first()


async def existing_keys(conn: AsyncConnection, queue_id: str, keys: set[str]) -> set[str]:
    query = select(C.key).where(C.queue_id == queue_id, C.key.in_(sorted(keys)))
    return {str(key) for key in (await conn.execute(query)).scalars()}


async def list_for_queue(
    conn: AsyncConnection,
    queue_id: str,
    *,
    states: Sequence[str] = (),
    limit: int = 100,
    before: tuple[datetime, str] | None = None,
) -> list[RowMapping]:
    """Newest first; ``before`` (created_at, id) continues after the last row of a page."""
    query = select(invocations).where(C.queue_id == queue_id)
    if states:
        query = query.where(C.state.in_(states))
    if before is not None:  # a row value: both stores walk the index from there
        query = query.where(tuple_(C.created_at, C.id) < tuple(before))
    query = query.order_by(C.created_at.desc(), C.id.desc()).limit(limit)
    return list((await conn.execute(query)).mappings())


async def cancel(conn: AsyncConnection, invocation_id: str, now: datetime) -> RowMapping | None:
    """Cancel if not final yet; returns the row as it stands afterwards."""
    await conn.execute(
        update(invocations)
        .where(C.id == invocation_id, C.state.in_(("pending", "running")))
        .values(state="cancelled", finished_at=now, lease_expires_at=None)
    )
    return (await conn.execute(select(invocations).where(C.id == invocation_id))).mappings().first()


RETRYABLE = ("failed", "expired", "cancelled")


async def retry(conn: AsyncConnection, ids: Sequence[str], now: datetime) -> list[RowMapping]:
    """Put finished-but-not-succeeded invocations back in their queues as new attempts:
    pending, one more attempt allowed than they used, their outcome, worker and times
    cleared, at the back of the queue as a submit now would be (``created_at`` now: a
    deadline counts from the retry). Id, key, function and arguments stay. Returns the
    rows it changed (one conditional UPDATE: an invocation that changed state meanwhile
    is left alone). Those its queue's tally counted are taken off it."""
    if not ids:
        return []
    await tallies.take_back(conn, ids, RETRYABLE)
    changed = (
        (
            await conn.execute(
                update(invocations)
                .where(C.id.in_(list(ids)), C.state.in_(RETRYABLE))
                .values(
                    state="pending",
                    max_attempts=C.attempts + 1,
                    worker_id=None,
                    lease_expires_at=None,
                    result=None,
                    error=None,
                    started_at=None,
                    finished_at=None,
                    available_at=now,
                    created_at=now,
                )
                .returning(C.id)
            )
        )
        .scalars()
        .all()
    )
    if not changed:
        return []
    # the new attempt streams afresh: the earlier attempt's items go
    await conn.execute(delete(stream_items).where(stream_items.c.invocation_id.in_(changed)))
    found = await conn.execute(select(invocations).where(C.id.in_(list(changed))))
    return list(found.mappings())


async def ids_in_state(conn: AsyncConnection, queue_id: str, state: str, limit: int) -> list[str]:
    """Up to ``limit`` ids of a queue's invocations in ``state``, oldest first."""
    query = (
        select(C.id)
        .where(C.queue_id == queue_id, C.state == state)
        .order_by(C.created_at, C.id)
        .limit(limit)
    )
    return list((await conn.execute(query)).scalars().all())


async def claim(
    conn: AsyncConnection,
    *,
    queue_id: str,
    kind: str,
    worker_id: str,
    limit: int,
    now: datetime,
    lease_s: float,
    temperature: float | None = None,
    limits: claimable.Limits = claimable.NO_LIMITS,
    keyed: bool = False,
) -> list[RowMapping]:
    """Lease up to ``limit`` claimable invocations of one queue to ``worker_id``.

    ``boltzmann`` queues sample among the top candidates by priority (see
    :mod:`lakeshore.domain.disciplines`); the others take them in order. ``limits``:
    the queue's running limits, counted under the queue's lock (see
    :mod:`lakeshore.store.claimable`). ``keyed``: the queue's pending rows have
    concurrency keys (as the claim's view of its queues saw it), and the claim takes
    turns between the keys (:func:`_turns_statement`); a per-key limit always does.
    """
    if limit <= 0:
        return []
    pg = _is_pg(conn)
    lease = {"b_now": now, "b_lease_s": lease_s}
    if not pg:
        lease["b_lease_expires_at"] = now + timedelta(seconds=lease_s)
    if limits.any:
        limit = await _room(conn, queue_id, limit, limits, pg)
        if limit <= 0:
            return []
    if keyed or limits.per_key is not None:
        turns = kind if kind in ("fifo", "filo") else "priority"  # boltzmann: by priority
        params: dict[str, Any] = {
            "b_queue_id": queue_id,
            "b_limit": limit,
            "b_per_key": limits.per_key,
            "b_worker_id": worker_id,
            **lease,
        }
        stmt = _turns_statement(turns, pg)
        return in_turns(turns, (await conn.execute(stmt, params)).mappings().all())
    if kind != "boltzmann":  # pick and lease in one statement; the rows come back unordered
        params = {"b_queue_id": queue_id, "b_limit": limit, "b_worker_id": worker_id, **lease}
        stmt = _lease_statement(kind if kind in _ORDER else "fifo", pg)
        return _in_order(kind, (await conn.execute(stmt, params)).mappings().all())
    query = (
        select(C.id, C.priority)
        .where(
            C.queue_id == queue_id,
            claimable.may_take(
                _in_queue(bindparam("b_queue", queue_id)),
                bindparam("b_at", now, type_=C.available_at.type),
            ),
        )
        .order_by(*_ORDER["boltzmann"])
        .limit(disciplines.candidate_count(limit))
        .with_for_update(skip_locked=True)  # written for PostgreSQL alone
    )
    rows = [(row[0], float(row[1])) for row in (await conn.execute(query)).all()]
    ids = disciplines.boltzmann_pick(rows, limit, temperature, _RNG)
    if not ids:
        return []
    # the rows are locked (PostgreSQL) or the write lock held (SQLite) since the select:
    # still pending, so the update names them by key alone (see _lease_statement)
    ids_param = bindparam("b_ids", type_=ARRAY(Text()) if pg else None, expanding=not pg)
    picked = C.id == any_(ids_param) if pg else C.id.in_(ids_param)
    stmt = update(invocations).where(picked).values(_leased(pg)).returning(*invocations.c)
    claimed = await conn.execute(stmt, {"b_ids": list(ids), "b_worker_id": worker_id, **lease})
    order = {invocation_id: i for i, invocation_id in enumerate(ids)}
    return sorted(claimed.mappings().all(), key=lambda row: order[row["id"]])


_QUEUE: ColumnElement[Any] = bindparam("b_queue_id")
_LOCK = select(claimable.lock_queue(_QUEUE))
_RUNNING = select(claimable.running_in_queue(_QUEUE))
_LOCK_PG, _ = psycopg_text(_LOCK)
_RUNNING_PG, _RUNNING_FIXED = psycopg_text(_RUNNING)


async def _room(
    conn: AsyncConnection, queue_id: str, limit: int, limits: claimable.Limits, pg: bool
) -> int:
    """How many the claim may lease under the queue's ``max_running``: counted once the
    queue's limit lock is held (PostgreSQL; on SQLite the write lock already is), so
    claims racing on other connections count one after another, each seeing what the
    one before it leased (each statement of a transaction reads what had committed when
    it began, and the lock's holder commits before the next one's count begins). On
    PostgreSQL the lock and the count go out at once, pipelined: one round trip, still
    run one after the other."""
    given = {"b_queue_id": queue_id}
    if not pg:
        if limits.max_running is None:
            return limit
        return min(
            limit, limits.max_running - int((await conn.execute(_RUNNING, given)).scalar_one())
        )
    if limits.max_running is None:
        await conn.execute(_LOCK, given)
        return limit
    driver = await psycopg_of(conn)
    async with driver.pipeline():
        await driver.execute(_LOCK_PG, given)
        counted = await driver.execute(_RUNNING_PG, {**_RUNNING_FIXED, **given})
    found = await counted.fetchone()
    assert found is not None, "a count has a row"
    return min(limit, limits.max_running - int(found[0]))


_TURN_ORDER = {
    "fifo": "created_at, id",
    "filo": "created_at DESC, id DESC",
    "priority": "priority DESC, created_at, id",
}


def in_turns(kind: str, rows: Sequence[RowMapping]) -> list[RowMapping]:
    """``rows`` in fair turns between their concurrency keys: in ``kind``'s order, the
    first of each key, then the second of each key …, within one priority (rows
    without a key are one key of their own)."""
    rank: dict[tuple[Any, Any], int] = {}
    ranked: list[tuple[float, int, int, RowMapping]] = []
    for row in _in_order(kind, rows):
        level = row["priority"] if kind == "priority" else None
        turn = rank[(level, row["concurrency_key"])] = (
            rank.get((level, row["concurrency_key"]), 0) + 1
        )
        ranked.append((-row["priority"] if kind == "priority" else 0, turn, len(ranked), row))
    return [row for *_, row in sorted(ranked, key=lambda r: r[:3])]


@functools.cache
def _turns_statement(kind: str, pg: bool) -> Any:
    """:func:`_lease_statement` in fair turns between concurrency keys (Hatchet's
    GROUP_ROUND_ROBIN): within one priority, the first claimable row of each key in
    ``kind``'s order, then the second of each …, up to ``b_limit``; a key takes no more
    than ``b_per_key`` (null: no limit) less its running rows. Rows without a key take
    their turns as one key of their own, from among the queue's first ``b_limit``
    pending rows in ``kind``'s order (what a claim without keys reads): finding every
    row without a key behind a flood of keyed ones would read the flood. The per-key
    limit leaves them alone.

    PostgreSQL reads only what it takes, with ``ix_invocations_pending_key``: the keys
    of the queue's pending rows, one index probe each (a recursive skip over the
    index), then each key's first rows in order, as many as the claim could take of it
    (``LIMIT``, locked ``SKIP LOCKED`` as a plain pick's), and the rows without a key
    from the queue's own index, as a plain pick reads them; the turns are ranked among
    those alone. SQLite reads the same, each key's first rows by a correlated ``IN``
    (it has no LATERAL; its one writer has no racing claimer to skip)."""
    order = _TURN_ORDER[kind]
    level = ", priority" if kind == "priority" else ""
    first = "priority DESC, " if kind == "priority" else ""
    now = "CAST(:b_now AS timestamptz)" if pg else ":b_now"
    rule = claimable.as_text(
        claimable.may_take(_in_queue(literal_column(":b_queue_id")), literal_column(now))
    )
    running = claimable.as_text(
        claimable.running_of_key(literal_column(":b_queue_id"), literal_column("ranked.k"))
    )
    mine = "invocations.queue_id = :b_queue_id"
    keys = (
        "WITH RECURSIVE keys(k) AS (SELECT (SELECT concurrency_key FROM invocations"
        f" WHERE {mine} AND state = 'pending' AND concurrency_key IS NOT NULL"
        " ORDER BY concurrency_key LIMIT 1)"
        " UNION ALL SELECT (SELECT concurrency_key FROM invocations"
        f" WHERE {mine} AND state = 'pending' AND concurrency_key > keys.k"
        " ORDER BY concurrency_key LIMIT 1) FROM keys WHERE keys.k IS NOT NULL)"
    )
    # each key's running rows, counted once: a key's turns come after those it runs, so
    # a key that already runs many waits behind one that runs none (a claim of one is not
    # always the oldest key's)
    load = f"load(k, busy) AS MATERIALIZED (SELECT k, {running.replace('ranked.k', 'keys.k')}"
    load += " FROM keys WHERE k IS NOT NULL)"
    if pg:
        room = "LEAST(:b_limit, COALESCE(CAST(:b_per_key AS int8) - load.busy, :b_limit))"
        sql = (
            f"{keys}, {load}, candidates AS MATERIALIZED ("
            "SELECT c.* FROM load CROSS JOIN LATERAL ("
            "SELECT load.k, load.busy, id, priority, created_at FROM invocations"
            f" WHERE {mine} AND concurrency_key = load.k AND {rule}"
            f" ORDER BY {order} LIMIT GREATEST(0, {room}) FOR UPDATE SKIP LOCKED) AS c"
            " UNION ALL SELECT * FROM (SELECT CAST(NULL AS text), 0, id, priority, created_at"
            " FROM invocations WHERE id = ANY(ARRAY(SELECT id FROM ("
            f"SELECT id, concurrency_key FROM invocations WHERE {mine} AND {rule}"
            f" ORDER BY {order} LIMIT :b_limit) AS head WHERE concurrency_key IS NULL))"
            " AND state = 'pending' FOR UPDATE SKIP LOCKED) AS plain)"
            f" SELECT id FROM candidates ORDER BY {first}"
            f"busy + row_number() OVER (PARTITION BY k{level} ORDER BY {order}), {order}"
            " LIMIT :b_limit"
        )
    else:
        # no LATERAL: each key's first rows come from a correlated IN, read by the index
        load = load.replace("AS MATERIALIZED", "AS")
        sql = (
            f"{keys}, {load} SELECT id FROM (SELECT id, priority, created_at, k, busy,"
            f" row_number() OVER (PARTITION BY k{level} ORDER BY {order}) AS n FROM ("
            "SELECT i.id, i.priority, i.created_at, load.k AS k, load.busy AS busy FROM load"
            " JOIN invocations AS i ON i.id IN (SELECT id FROM invocations"
            f" WHERE {mine} AND concurrency_key = load.k AND {rule}"
            f" ORDER BY {order} LIMIT :b_limit)"
            " UNION ALL SELECT id, priority, created_at, NULL, 0 FROM ("
            "SELECT id, priority, created_at, concurrency_key FROM invocations"
            f" WHERE {mine} AND {rule} ORDER BY {order} LIMIT :b_limit) AS head"
            " WHERE concurrency_key IS NULL)) AS ranked"
            " WHERE k IS NULL OR :b_per_key IS NULL OR n <= :b_per_key - busy"
            f" ORDER BY {first}busy + n, {order} LIMIT :b_limit"
        )
    times = bindparam("b_now", type_=C.available_at.type)
    picked = text(sql).bindparams(times).columns(C.id).cte("picked").prefix_with("MATERIALIZED")
    ids = select(picked.c.id)
    by_key = C.id == any_(func.array(ids.scalar_subquery())) if pg else C.id.in_(ids)
    return (
        update(invocations)
        .add_cte(picked)
        .where(by_key)
        .values(_leased(pg))
        .returning(*invocations.c)
    )


_SECOND: ColumnElement[Any] = literal_column("interval '1 second'")


def _in_queue(queue_id: ColumnElement[Any]) -> claimable.Candidate:
    """A claim's candidates: the stored rows of the one queue it picks from (named by
    the claim's own value, so the queue's term is read once, not once per row)."""
    return claimable.Candidate(state=C.state, available_at=C.available_at, queue_id=queue_id)


def _leased(pg: bool) -> dict[str, Any]:
    """The columns a claim sets. A lease runs ``b_lease_s`` from the row's update, not
    from ``b_now`` (when the claim began): a claim slowed by a pick, a busy database or
    the earlier statements of its transaction must not hand out a lease that has already
    run out, which the reaper would take back as it is granted. On PostgreSQL the time
    the transaction has taken until the row's update is measured by the database
    (``clock_timestamp()`` at the update, less the transaction's start) and added to
    ``b_now``: the lease stays on the server's clock (and on a clock a test gives). On
    SQLite, one writer in one process, the statement begins once the write lock is held
    and is given ``b_now`` + lease (``b_lease_expires_at``)."""
    now = bindparam("b_now", type_=C.available_at.type)
    expires: ColumnElement[Any]
    if pg:
        since_begin = func.clock_timestamp() - func.transaction_timestamp()
        lease = bindparam("b_lease_s", type_=Float()) * _SECOND
        expires = cast(now + since_begin + lease, C.lease_expires_at.type)
    else:
        expires = bindparam("b_lease_expires_at", type_=C.lease_expires_at.type)
    return {
        "state": "running",
        "worker_id": bindparam("b_worker_id"),
        "lease_expires_at": expires,
        "started_at": now,
        "attempts": C.attempts + 1,
    }


@functools.cache
def _lease_statement(kind: str, pg: bool) -> Any:
    """Pick up to ``b_limit`` claimable invocations of ``b_queue_id`` in ``kind``'s order
    and lease them to ``b_worker_id``, in one statement, built once per kind and dialect
    (a claim is the hottest statement: building it per call cost more than running it).
    The pick is a materialized CTE: a subquery with LIMIT … SKIP LOCKED may be run again
    within the statement on PostgreSQL, leasing more than the limit.

    The update finds the picked rows by primary key and by nothing else, whatever the
    planner's statistics say. With ``id IN (SELECT id FROM picked) AND state =
    'pending'``, statistics taken while the table was near empty (a fresh deployment, a
    restore, autovacuum behind) made PostgreSQL scan every pending row and, for each,
    the picked ones (a nested-loop semi join): a claim of 1,000 with 50,000 pending took
    25 s instead of 40 ms; a join on ``id`` or ``id = ANY(…)`` beside ``state`` was
    planned the same way, or as a scan of the pending rows with the array as a filter.
    The picked rows are locked (``FOR UPDATE``, which re-checks the pick's conditions on
    the row it locks) or, on SQLite, the write lock is held: they are pending still, so
    the update names them by ``id`` alone, an array on PostgreSQL (the array's subquery
    runs once, first; every other plan reads the whole table, whose size in pages the
    planner knows however old its statistics are)."""
    now = bindparam("b_now", type_=C.available_at.type)
    queue_id: ColumnElement[Any] = bindparam("b_queue_id")
    picked = (
        select(C.id)
        .where(C.queue_id == queue_id, claimable.may_take(_in_queue(queue_id), now))
        .order_by(*_ORDER[kind])
        .limit(bindparam("b_limit"))
        .with_for_update(skip_locked=True)  # written for PostgreSQL alone
    )
    cte = picked.cte("picked").prefix_with("MATERIALIZED")
    ids = select(cte.c.id)
    by_key = C.id == any_(func.array(ids.scalar_subquery())) if pg else C.id.in_(ids)
    return (
        update(invocations).add_cte(cte).where(by_key).values(_leased(pg)).returning(*invocations.c)
    )


def _expired(cutoff_s: float, now: datetime) -> dict[str, Any]:
    error = {"type": "DeadlineExpired", "message": f"not started within {cutoff_s:g} s"}
    return {"state": "expired", "finished_at": now, "error": error}


# ``deadline_cutoff_s`` counts from the submit and ends with the first dispatch: work that
# was claimed once (a retry waiting out its backoff, work handed back) keeps its place
_NEVER_STARTED = (C.state == "pending", C.started_at.is_(None))


def _due_before(at: datetime) -> ColumnElement[bool]:
    """Never-started work due before ``at``: a delayed submit's cutoff counts from its
    due time (``available_at``), anyone else's from its submit, which is then the same
    instant. A row is never due before it was made, so ``created_at`` bounds it too,
    and lets the queue's index read only the rows old enough."""
    return and_(C.created_at < at, C.available_at < at)


async def expire_overdue(
    conn: AsyncConnection, queue_id: str, cutoff_s: float, now: datetime
) -> int:
    """``deadline_cutoff_s`` of one queue: pending work never started and due (submitted,
    unless delayed) longer ago than that is expired. A cutoff the date arithmetic cannot
    hold (stored before cutoffs were bounded) reaches back before any submit: nothing is
    overdue."""
    try:
        late_before = now - timedelta(seconds=cutoff_s)
    except (OverflowError, ValueError):
        return 0
    expired = await conn.execute(
        update(invocations)
        .where(C.queue_id == queue_id, *_NEVER_STARTED, _due_before(late_before))
        .values(_expired(cutoff_s, now))
    )
    return int(expired.rowcount)


async def expire_all_overdue(conn: AsyncConnection, now: datetime) -> list[tuple[str, str]]:
    """``deadline_cutoff_s`` of every queue that sets one (paused ones too): pending work
    never started and submitted longer ago than its queue's cutoff is expired, whether or
    not a claim looks at that queue. One read of the cutoffs and one UPDATE for every
    queue (grouped by cutoff, not a statement per queue). Returns (id, queue id) of each
    invocation expired.

    A cutoff the date arithmetic cannot hold (stored before cutoffs were bounded) is
    skipped and logged; should the UPDATE fail, each cutoff's queues are tried alone, so
    one queue never stops the others' expiry."""
    cutoff = queues.c.admission["deadline_cutoff_s"].as_float()
    rows = (await conn.execute(select(queues.c.id, cutoff).where(cutoff.is_not(None)))).all()
    by_cutoff: dict[float, list[str]] = {}
    for queue_id, cutoff_s in rows:
        by_cutoff.setdefault(float(cutoff_s), []).append(str(queue_id))
    late_before = _late_before(by_cutoff, now)
    if not late_before:
        return []
    done = await isolated(
        conn, "deadline expiry", ["all queues"], lambda: _expire(conn, late_before, now)
    )
    if done is not None:
        return done
    expired: list[tuple[str, str]] = []
    for cutoff_s, (before, ids) in late_before.items():
        alone = {cutoff_s: (before, ids)}
        expired += (
            await isolated(conn, "deadline expiry", ids, partial(_expire, conn, alone, now)) or []
        )
    return sorted(expired)


def _late_before(
    by_cutoff: dict[float, list[str]], now: datetime
) -> dict[float, tuple[datetime, list[str]]]:
    """Each cutoff's instant (work submitted before it is late), and its queues."""
    late: dict[float, tuple[datetime, list[str]]] = {}
    for cutoff_s, ids in by_cutoff.items():
        try:
            late[cutoff_s] = (now - timedelta(seconds=cutoff_s), ids)
        except (OverflowError, ValueError) as exc:
            log.warning(
                "deadline_cutoff_s %r of queue(s) %s is out of range (%s); skipped",
                cutoff_s,
                ", ".join(ids),
                exc,
                extra={"queue_ids": ids},
            )
    return late


async def _expire(
    conn: AsyncConnection, late: dict[float, tuple[datetime, list[str]]], now: datetime
) -> list[tuple[str, str]]:
    # each error names its queue's own cutoff
    error = case(
        *(
            (C.queue_id.in_(ids), literal(_expired(cutoff_s, now)["error"], C.error.type))
            for cutoff_s, (_, ids) in late.items()
        )
    )
    done = await conn.execute(
        update(invocations)
        .where(
            *_NEVER_STARTED,
            or_(*(and_(C.queue_id.in_(ids), _due_before(t)) for t, ids in late.values())),
        )
        .values(state="expired", finished_at=now, error=error)
        .returning(C.id, C.queue_id)
    )
    return sorted((str(i), str(q)) for i, q in done.all())


async def next_available_at(
    conn: AsyncConnection, queue_ids: Sequence[str], now: datetime
) -> datetime | None:
    """When the earliest pending invocation of these queues is (or was) claimable; None
    when they hold no pending work. A delayed submit not due yet at ``now`` is left out
    (:func:`claimable.waiting`): a ``--burst`` daemon runs what is queued and exits, and
    is not held until a time that may be a year away."""
    if not queue_ids:
        return None
    query = select(func.min(C.available_at)).where(
        C.queue_id.in_(list(queue_ids)), claimable.waiting(now)
    )
    value: datetime | None = (await conn.execute(query)).scalar_one()
    return value


async def scheduled_count(conn: AsyncConnection, queue_id: str, now: datetime) -> int:
    """How many of the queue's delayed submits are not due yet at ``now``
    (:func:`claimable.scheduled`): counted apart from ``pending`` until due."""
    query = select(func.count()).where(
        C.queue_id == queue_id, text(DEFERRED), claimable.scheduled(now)
    )
    return int((await conn.execute(query)).scalar_one())


async def next_due_at(
    conn: AsyncConnection, queue_ids: Sequence[str], now: datetime
) -> datetime | None:
    """When the earliest pending invocation of these queues that is not yet claimable
    (a retry waiting out its backoff, a delayed submit) falls due; None when there is
    none. A waiting claim wakes then instead of at its next re-check. Read through
    ``ix_invocations_deferred`` (whose condition it repeats word for word): the first
    entry past ``now`` of each queue, however much is pending."""
    if not queue_ids:
        return None
    query = select(func.min(C.available_at)).where(
        C.queue_id.in_(list(queue_ids)), text(DEFERRED), C.available_at > now
    )
    value: datetime | None = (await conn.execute(query)).scalar_one()
    return value
