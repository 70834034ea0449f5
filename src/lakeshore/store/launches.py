"""Launch records: the launch tracker's in-flight tokens and what each launch became.

A launch is ``in_flight`` from the moment the controller asks a provider for a daemon
until that daemon says hello with its ``launch_id`` (``succeeded``), the provider call
fails (``failed``), or its provider's TTL passes without a hello (``expired``). The
in-flight count per queue or pool is what the controller subtracts from its target, so a
booting daemon is never launched twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    RowMapping,
    and_,
    bindparam,
    case,
    exists,
    func,
    insert,
    literal,
    or_,
    select,
    tuple_,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from lakeshore.store.tables import launches, providers, tokens, workers

L = launches.c


async def record(conn: AsyncConnection, rows: Sequence[dict[str, Any]]) -> None:
    """Insert launches in flight (one per row)."""
    if rows:
        await conn.execute(insert(launches), [{"state": "in_flight", **row} for row in rows])


async def resolve(
    conn: AsyncConnection,
    launch_id: str,
    *,
    state: str,
    now: datetime,
    handle: Any = None,
    error: str | None = None,
) -> None:
    values: dict[str, Any] = {"state": state, "resolved_at": now}
    if handle is not None:
        values["handle"] = handle
    if error is not None:
        values["error"] = error
    await conn.execute(update(launches).where(L.id == launch_id).values(values))


async def started(conn: AsyncConnection, launch_id: str, handle: Any, expires_at: datetime) -> None:
    """The provider call returned: keep its handle; the launch stays in flight until hello,
    or until ``expires_at`` (the provider's TTL, from now). A launch no longer in flight
    (expired while its call ran) keeps its state; its handle is still kept, so what the call
    made can be found and stopped."""
    later = literal(expires_at, type_=L.expires_at.type)  # stored as the column stores it
    still_in_flight = case((L.state == "in_flight", later), else_=L.expires_at)
    await conn.execute(
        update(launches).where(L.id == launch_id).values(handle=handle, expires_at=still_in_flight)
    )


async def started_many(conn: AsyncConnection, rows: Sequence[tuple[str, Any, datetime]]) -> None:
    """:func:`started` for many launches at once: (launch id, handle, expires at) each, in
    one statement (``executemany``)."""
    if not rows:
        return
    later = bindparam("b_expires", type_=L.expires_at.type)
    still_in_flight = case((L.state == "in_flight", later), else_=L.expires_at)
    query = (
        update(launches)
        .where(L.id == bindparam("b_id"))
        .values(handle=bindparam("b_handle", type_=L.handle.type), expires_at=still_in_flight)
    )
    params = [{"b_id": i, "b_handle": h, "b_expires": e} for i, h, e in rows]
    await conn.execute(query, params)


async def hello(
    conn: AsyncConnection, namespace_id: str, launch_id: str, worker_id: str, now: datetime
) -> bool:
    """A launched daemon said hello: its launch succeeded. False if no such launch."""
    done = await conn.execute(
        update(launches)
        .where(L.id == launch_id, L.namespace_id == namespace_id)
        .where(or_(L.worker_id.is_(None), L.worker_id == worker_id))
        .values(
            worker_id=worker_id,
            state="succeeded",
            resolved_at=func.coalesce(L.resolved_at, now),
        )
    )
    return done.rowcount == 1


async def expire(conn: AsyncConnection, now: datetime) -> list[RowMapping]:
    """Launches that are over, to be stopped at their provider, with their tokens revoked.

    Two kinds: in-flight launches past their TTL become ``expired`` (their slot is free
    again; a daemon that never said hello cannot join late); and launches whose daemon said
    hello but whose worker row is gone without a retirement — the reaper dropped it after
    the worker TTL, so its instance or pod vanished or is cut off — are marked terminated
    now (so no later tick picks them again), and a token read from that instance opens
    nothing. Returns those that a provider started (they have a handle).
    """
    lost = (
        update(launches)
        .where(
            L.state == "succeeded",
            L.terminated_at.is_(None),
            L.worker_id.is_not(None),
            ~exists().where(workers.c.id == L.worker_id),
        )
        .values(terminated_at=now)
        .returning(*launches.c)
    )
    gone = list((await conn.execute(lost)).mappings().all())
    overdue = select(L.token_id).where(
        L.state == "in_flight", L.expires_at <= now, L.token_id.is_not(None)
    )
    revoked = or_(tokens.c.id.in_(overdue), tokens.c.id.in_([row["token_id"] for row in gone]))
    await conn.execute(
        update(tokens).where(revoked, tokens.c.revoked_at.is_(None)).values(revoked_at=now)
    )
    done = await conn.execute(
        update(launches)
        .where(L.state == "in_flight", L.expires_at <= now)
        .values(state="expired", resolved_at=now)
        .returning(*launches.c)
    )
    return [row for row in [*gone, *done.mappings().all()] if row["handle"] is not None]


async def in_flight_by_scope(
    conn: AsyncConnection, scopes: Iterable[tuple[str, str]] | None, now: datetime
) -> dict[tuple[str, str], int]:
    """Unexpired in-flight launches per (namespace id, scope), in one query: of
    ``scopes`` (each present, 0 when none), or of every scope that has some (``None``)."""
    keys = None if scopes is None else sorted(set(scopes))
    if keys == []:
        return {}
    query = (
        select(L.namespace_id, L.scope, func.count())
        .where(L.state == "in_flight", L.expires_at > now)
        .group_by(L.namespace_id, L.scope)
    )
    if keys is not None and len(keys) <= 500:
        query = query.where(tuple_(L.namespace_id, L.scope).in_(keys))
    counts = {(ns, scope): int(n) for ns, scope, n in (await conn.execute(query)).all()}
    if keys is None:
        return counts
    return {key: counts.get(key, 0) for key in keys}


async def for_token(conn: AsyncConnection, token_id: str) -> RowMapping | None:
    """The launch a worker token was minted for."""
    query = select(launches).where(L.token_id == token_id)
    return (await conn.execute(query.limit(1))).mappings().first()


async def for_worker(conn: AsyncConnection, worker_id: str) -> RowMapping | None:
    query = select(launches).where(L.worker_id == worker_id).order_by(L.created_at.desc())
    return (await conn.execute(query.limit(1))).mappings().first()


async def terminated(
    conn: AsyncConnection, launch_id: str, now: datetime, error: str | None = None
) -> None:
    values: dict[str, Any] = {"terminated_at": now, "terminate_error": error}
    await conn.execute(update(launches).where(L.id == launch_id).values(values))


async def terminated_many(
    conn: AsyncConnection, rows: Sequence[tuple[str, datetime, str | None]]
) -> None:
    """:func:`terminated` for many launches at once: (launch id, when, error) each, in one
    statement (``executemany``)."""
    if not rows:
        return
    query = (
        update(launches)
        .where(L.id == bindparam("b_id"))
        .values(
            terminated_at=bindparam("b_at", type_=L.terminated_at.type),
            terminate_error=bindparam("b_error", type_=L.terminate_error.type),
        )
    )
    await conn.execute(query, [{"b_id": i, "b_at": at, "b_error": e} for i, at, e in rows])


async def list_for_provider(
    conn: AsyncConnection,
    namespace_id: str,
    provider_name: str,
    *,
    limit: int,
    before: tuple[datetime, str] | None = None,
) -> list[RowMapping]:
    """A provider's launches, newest first; ``before`` is the (created_at, id) to page from."""
    query = select(launches).where(
        and_(L.namespace_id == namespace_id, L.provider_name == provider_name)
    )
    if before is not None:
        query = query.where(tuple_(L.created_at, L.id) < before)
    query = query.order_by(L.created_at.desc(), L.id.desc()).limit(limit)
    return list((await conn.execute(query)).mappings())


async def live_on(conn: AsyncConnection, provider_kind: str) -> list[RowMapping]:
    """Launches through providers of ``provider_kind`` that were started and not yet
    terminated (what a shutting-down ``lakeshore up`` must stop)."""
    query = (
        select(launches)
        .join(
            providers,
            and_(
                providers.c.namespace_id == L.namespace_id,
                providers.c.name == L.provider_name,
            ),
        )
        .where(
            providers.c.kind == provider_kind,
            L.handle.is_not(None),
            L.terminated_at.is_(None),
            L.state.in_(("in_flight", "succeeded")),
        )
    )
    return list((await conn.execute(query)).mappings())


async def in_flight_for_namespace(
    conn: AsyncConnection, namespace_id: str, now: datetime, limit: int = 200
) -> list[RowMapping]:
    """A namespace's unexpired in-flight launches (booting daemons), oldest first."""
    query = (
        select(launches)
        .where(L.namespace_id == namespace_id, L.state == "in_flight", L.expires_at > now)
        .order_by(L.created_at, L.id)
        .limit(limit)
    )
    return list((await conn.execute(query)).mappings())
