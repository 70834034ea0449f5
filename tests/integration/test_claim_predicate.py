"""The one claim rule (``store/claimable.py``) as a table, run by each store.

Each case is one invocation in a queue of its own (so a queue's state is the case's),
asked of one worker: a claim's form (no worker terms: its queues and free slots come
from the read that chose them) and the hand-off's (the worker subscribed and with room).
The same expression is then asked by the hand-off of a row about to go in, whose due
time is the statement's parameter: a delayed submit is not handed on.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import bindparam, insert, select

from lakeshore.domain.queue import parse_spec
from lakeshore.store import claimable
from lakeshore.store import invocations as inv_store
from lakeshore.store import queues as queue_store
from lakeshore.store.engine import Store
from lakeshore.store.tables import invocations, namespaces, queues, worker_queues, workers

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
NS = "ns_default"


@dataclass(frozen=True)
class Case:
    name: str
    claim: bool  # a claim may take it (the worker's terms left to the claim's read)
    handed: bool  # ... and this worker, as the hand-off asks
    state: str = "pending"
    due_in_s: float = 0.0  # available_at - now
    queue: str = "active"
    subscribed: bool = True
    running: int = 0  # the worker's running invocations elsewhere
    holds: int = 2
    attempts: int = 0


CASES = [
    Case("pending and due now", claim=True, handed=True),
    Case("pending and due a while ago", claim=True, handed=True, due_in_s=-60),
    Case("delayed: due in a second", claim=False, handed=False, due_in_s=1),
    Case("delayed: due in a year", claim=False, handed=False, due_in_s=365 * 86400),
    Case("retry waiting out its backoff", claim=False, handed=False, due_in_s=4, attempts=1),
    Case("running", claim=False, handed=False, state="running"),
    Case("succeeded", claim=False, handed=False, state="succeeded"),
    Case("cancelled", claim=False, handed=False, state="cancelled"),
    Case("queue paused", claim=False, handed=False, queue="paused"),
    Case("queue draining", claim=True, handed=True, queue="draining"),
    Case("queue archived", claim=False, handed=False, queue="archived"),
    Case("worker not subscribed", claim=True, handed=False, subscribed=False),
    Case("worker holds all it may", claim=True, handed=False, running=2, holds=2),
    Case("worker has room for one more", claim=True, handed=True, running=1, holds=2),
]


async def _setup(store: Store, case: Case, n: int) -> tuple[str, str]:
    """The case's queue, worker and invocation; returns (worker id, invocation id)."""
    queue_id, worker_id, inv_id = f"q_{n}", f"w_{n}", f"inv_{n}"
    row = {
        "namespace_id": NS,
        "queue_id": queue_id,
        "queue_name": f"q{n}",
        "fn": "m:f",
        "args": [],
        "kwargs": {},
        "created_at": NOW,
    }
    async with store.write() as conn:
        await queue_store.insert_queue(
            conn, id=queue_id, namespace_id=NS, spec=parse_spec({"name": f"q{n}"}), now=NOW
        )
        await conn.execute(queues.update().where(queues.c.id == queue_id).values(state=case.queue))
        await conn.execute(
            insert(workers).values(
                id=worker_id,
                namespace_id=NS,
                name=worker_id,
                runners=[],
                tags=[],
                capabilities={},
                max_invocations=case.holds,
                last_seen_at=NOW,
                created_at=NOW,
            )
        )
        if case.subscribed:
            await conn.execute(insert(worker_queues).values(worker_id=worker_id, queue_id=queue_id))
        held = [
            {**row, "id": f"held_{n}_{i}", "state": "running", "worker_id": worker_id}
            for i in range(case.running)
        ]
        await conn.execute(
            insert(invocations),
            [
                *({**h, "available_at": NOW, "attempts": 1} for h in held),
                {
                    **row,
                    "id": inv_id,
                    "worker_id": None,
                    "state": case.state,
                    "attempts": case.attempts,
                    "available_at": NOW + timedelta(seconds=case.due_in_s),
                },
            ],
        )
    return worker_id, inv_id


async def test_the_claim_rule_decides_each_case_alike_on_both_stores(store: Store) -> None:
    async with store.write() as conn:
        await conn.execute(insert(namespaces).values(id=NS, name="default", created_at=NOW))
    made = [await _setup(store, case, n) for n, case in enumerate(CASES)]
    now = bindparam("now", type_=invocations.c.available_at.type)
    taker = claimable.Taker(worker_id=bindparam("worker_id"), holds=bindparam("holds"))
    by_claim = select(invocations.c.id).where(
        invocations.c.id == bindparam("id"), claimable.may_take(claimable.STORED, now)
    )
    by_worker = select(invocations.c.id).where(
        invocations.c.id == bindparam("id"), claimable.may_take(claimable.STORED, now, taker)
    )
    found = []
    async with store.read() as conn:
        for case, (worker_id, inv_id) in zip(CASES, made, strict=True):
            params = {"id": inv_id, "now": NOW, "worker_id": worker_id, "holds": case.holds}
            claimed = (await conn.execute(by_claim, params)).first() is not None
            handed = (await conn.execute(by_worker, params)).first() is not None
            found.append((case.name, claimed, handed))
    assert found == [(case.name, case.claim, case.handed) for case in CASES]


async def test_scheduled_and_waiting_split_pending_by_due_time(store: Store) -> None:
    """A delayed submit not due yet is ``scheduled``; a retry in its backoff and a due
    delayed submit count as pending; neither counts a finished invocation."""
    async with store.write() as conn:
        await conn.execute(insert(namespaces).values(id=NS, name="default", created_at=NOW))
    for n, case in enumerate(CASES[:6]):
        await _setup(store, case, n)
    query = select(invocations.c.id).order_by(invocations.c.id)
    async with store.read() as conn:
        scheduled = (await conn.execute(query.where(claimable.scheduled(NOW)))).scalars().all()
        waiting = (await conn.execute(query.where(claimable.waiting(NOW)))).scalars().all()
    assert scheduled == ["inv_2", "inv_3"]
    assert waiting == ["inv_0", "inv_1", "inv_4"]


@pytest.mark.parametrize(
    ("due_in_s", "ahead_due_in_s", "state"),
    [
        (0, None, "running"),
        (5, None, "pending"),  # delayed: not due yet
        (0, 0, "pending"),  # claimable work ahead of it goes first
        (0, 60, "running"),  # work ahead that is not due yet holds nothing back
    ],
)
async def test_the_hand_off_asks_the_same_rule_of_the_row_it_inserts(
    store: Store, due_in_s: float, ahead_due_in_s: float | None, state: str
) -> None:
    """A submit due now is handed to the waiting worker; a delayed one goes in pending
    (not due yet), for a claim to take once it falls due; so does one behind work the
    queue could hand out now."""
    async with store.write() as conn:
        await conn.execute(insert(namespaces).values(id=NS, name="default", created_at=NOW))
    ahead = Case("ahead", True, True, due_in_s=ahead_due_in_s or 0)
    if ahead_due_in_s is None:
        ahead = Case("nothing ahead", False, False, state="succeeded")
    worker_id, _ = await _setup(store, ahead, 0)
    async with store.read() as conn:
        [revision] = (
            await conn.execute(select(queues.c.revision).where(queues.c.id == "q_0"))
        ).scalars()
    row = {
        "id": "inv_new",
        "namespace_id": NS,
        "queue_id": "q_0",
        "queue_name": "q0",
        "fn": "m:f",
        "args": [],
        "kwargs": {},
        "priority": 0.0,
        "key": None,
        "state": "pending",
        "attempts": 0,
        "max_attempts": 3,
        "retry": None,
        "concurrency_key": None,
        "timeout_s": None,
        "available_at": NOW + timedelta(seconds=due_in_s),
        "created_at": NOW,
    }
    async with store.statement() as conn:
        stored = await inv_store.insert_one_handed(
            conn, row, revision, worker_id=worker_id, holds=2, lease_s=30
        )
    assert stored is not None and stored["state"] == state
    async with store.read() as conn:
        [(kept, worker)] = (
            await conn.execute(
                select(invocations.c.state, invocations.c.worker_id).where(
                    invocations.c.id == "inv_new"
                )
            )
        ).all()
    assert (kept, worker) == (state, worker_id if state == "running" else None)
