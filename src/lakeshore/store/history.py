"""What ``wait_target`` learns from, read from the tables the queue already writes.

No table of its own: service times are the invocations' ``started_at`` → ``finished_at``,
boot times the launches' ``created_at`` → ``resolved_at`` of those that said hello, the
arrival rate the invocations' ``created_at``, the delayed work their ``available_at``, and
a daemon's idleness its last ``finished_at`` (or its hello), and the schedules' slots
falling due within a boot their ``spec`` and ``last_slot``; and, before any boot is
learned, the ``boot_s`` of the scope's provider registration (its ``config``). The rules
that turn these into estimates are :mod:`lakeshore.elasticity.estimates`, shared with the
simulator.

Read only for the scopes whose policy learns (``wait_target``): a few indexed queries per
such scope, each bounded (the latest 500 finishes, 20 launches, 20 minutes of submits).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import case, func, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from lakeshore.domain import fleet
from lakeshore.domain import schedules as rules
from lakeshore.domain.fleet import WorkerView
from lakeshore.domain.queue import Queue
from lakeshore.domain.scaling import Policy
from lakeshore.elasticity import estimates
from lakeshore.elasticity.snapshot import Key
from lakeshore.elasticity.units import scope_of
from lakeshore.store import claimable
from lakeshore.store.tables import FINISHED, invocations, launches, schedules, workers

INV = invocations.c
L = launches.c
BOOTS_READ = 4 * estimates.BOOT_SAMPLES  # launches read to find the latest of one template


def learning(queues: Sequence[tuple[str, Queue]]) -> dict[Key, list[Queue]]:
    """The scopes whose policy learns from their history, each with its queues (a pool's
    members, or the queue alone)."""
    by_scope: dict[Key, list[Queue]] = {}
    for _, queue in queues:
        by_scope.setdefault((queue.namespace_id, scope_of(queue)), []).append(queue)
    return {
        key: members
        for key, members in by_scope.items()
        if any(q.spec.elasticity and q.spec.elasticity.kind == "wait_target" for q in members)
    }


async def history_of(
    conn: AsyncConnection,
    key: Key,
    members: Sequence[Queue],
    fleet: Sequence[WorkerView],
    now: datetime,
    provider_boot_s: float | None = None,
) -> estimates.History:
    """One scope's recent history (``fleet``: its workers, to time their idleness;
    ``provider_boot_s``: the ``boot_s`` its provider's registration configures)."""
    ids = [q.id for q in members]
    boots = await _boots(conn, key, members)
    policy = Policy.from_spec(members[0].spec)
    boot_s = estimates.boot_of(policy, boots, provider_boot_s).value
    return estimates.History(
        service_s=await _services(conn, ids, now),
        boot_s=boots,
        per_minute=await _per_minute(conn, ids, now),
        due_soon=await _due_soon(conn, ids, now, boot_s)
        + await _slots_soon(conn, ids, now, boot_s),
        idle_for=await _idle_for(conn, fleet, now),
        provider_boot_s=provider_boot_s,
    )


def provider_of(members: Sequence[Queue]) -> str | None:
    """The provider a scope launches through (its first member that names one)."""
    return _template_of(members)[0]


async def _services(conn: AsyncConnection, ids: Sequence[str], now: datetime) -> list[float]:
    since = now - timedelta(seconds=estimates.SERVICE_WINDOW_S)
    query = (
        select(INV.started_at, INV.finished_at)
        .where(INV.queue_id.in_(ids), text(FINISHED), INV.finished_at >= since)
        .where(INV.started_at.is_not(None))
        .order_by(INV.finished_at.desc())
        .limit(estimates.SERVICE_SAMPLES)
    )
    rows = (await conn.execute(query)).all()
    return [max(0.0, (done - began).total_seconds()) for began, done in rows]


def _template_of(members: Sequence[Queue]) -> tuple[str | None, dict[str, Any]]:
    """The provider the scope launches through and what it asks for (its launch body,
    the queues joined left out: they differ between scopes, not between boots)."""
    source = next((q for q in members if fleet.provider_name(q.spec)), members[0])
    body = fleet.launch_body(source.spec.daemon_template, ())
    return fleet.provider_name(source.spec), _comparable(dataclasses.asdict(body))


def _comparable(body: Any) -> dict[str, Any]:
    plain = json.loads(json.dumps(body)) if body else {}
    return {k: v for k, v in plain.items() if k != "queues"} if isinstance(plain, dict) else {}


async def _boots(conn: AsyncConnection, key: Key, members: Sequence[Queue]) -> list[float]:
    """Request → hello of the scope's latest launches through its provider, from its
    template (a launch of another provider or template boots in its own time)."""
    namespace_id, scope = key
    provider, template = _template_of(members)
    query = (
        select(L.created_at, L.resolved_at, L.body)
        .where(L.namespace_id == namespace_id, L.scope == scope, L.state == "succeeded")
        .where(L.resolved_at.is_not(None), L.provider_name == (provider or ""))
        .order_by(L.created_at.desc())
        .limit(BOOTS_READ)
    )
    rows = (await conn.execute(query)).all()
    same = [(asked, hello) for asked, hello, body in rows if _comparable(body) == template]
    return [
        max(0.0, (hello - asked).total_seconds()) for asked, hello in same[: estimates.BOOT_SAMPLES]
    ]


async def _per_minute(conn: AsyncConnection, ids: Sequence[str], now: datetime) -> list[int]:
    """Submits in each of the last minutes, newest first: one row of conditional counts."""
    edges = [now - timedelta(minutes=i) for i in range(estimates.ARRIVAL_MINUTES + 1)]
    columns = [
        func.coalesce(func.sum(case((INV.created_at >= edges[i + 1], 1), else_=0)), 0).label(
            f"m{i}"
        )
        for i in range(estimates.ARRIVAL_MINUTES)
    ]
    query = select(*columns).where(
        INV.queue_id.in_(ids), INV.created_at >= edges[-1], INV.created_at <= now
    )
    row = (await conn.execute(query)).one()
    cumulative = [int(n) for n in row]  # submits since the start of minute i (from now)
    return [cumulative[0], *(b - a for a, b in itertools.pairwise(cumulative))]


async def _due_soon(conn: AsyncConnection, ids: Sequence[str], now: datetime, boot_s: float) -> int:
    """Delayed invocations (not due yet) falling due within a boot."""
    horizon = now + timedelta(seconds=boot_s)
    query = select(func.count()).where(
        INV.queue_id.in_(ids), claimable.scheduled(now), INV.available_at <= horizon
    )
    return int((await conn.execute(query)).scalar_one())


MAX_SLOTS = 1_000  # slots counted per scope: a schedule every millisecond counts as this


async def _slots_soon(
    conn: AsyncConnection, ids: Sequence[str], now: datetime, boot_s: float
) -> int:
    """Slots of the scope's enabled schedules falling due within a boot (with ``catch_up:
    all``, those still owed too): each is an invocation about to be enqueued."""
    horizon = now + timedelta(seconds=boot_s)
    query = select(schedules.c.spec, schedules.c.last_slot).where(
        schedules.c.queue_id.in_(ids), schedules.c.enabled.is_(True)
    )
    count = 0
    for stored, last in (await conn.execute(query)).all():
        spec = rules.parse({**stored, "enabled": True})
        slot = rules.upcoming(spec, last, now)
        while slot is not None and slot <= horizon and count < MAX_SLOTS:
            count += 1
            slot = rules.next_slot(spec, slot)
    return count


async def _idle_for(
    conn: AsyncConnection, fleet: Sequence[WorkerView], now: datetime
) -> dict[str, float]:
    """How long each idle worker has had nothing to run: since its last finish, or since
    its hello when it has finished nothing."""
    idle = [w.id for w in fleet if not w.running and not w.current_invocations]
    if not idle:
        return {}
    hello = select(workers.c.id, workers.c.created_at).where(workers.c.id.in_(idle))
    since = {wid: at for wid, at in (await conn.execute(hello)).all()}
    last = (
        select(INV.worker_id, func.max(INV.finished_at))
        .where(INV.worker_id.in_(idle), INV.finished_at.is_not(None))
        .group_by(INV.worker_id)
    )
    for wid, at in (await conn.execute(last)).all():
        if at is not None and (wid not in since or at > since[wid]):
            since[wid] = at
    return {wid: max(0.0, (now - at).total_seconds()) for wid, at in since.items()}
