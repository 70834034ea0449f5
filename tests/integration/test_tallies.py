"""``stats``' counts by state from the leader's tallies, on both stores: whatever the
order of finishes, tallies, retention deletes and retries, ``byState`` through the API
equals a count of every row, and the tally takes the finished rows off the live read."""

from __future__ import annotations

import random
from datetime import timedelta

from sqlalchemy import func, select

from lakeshore.domain.retention import TALLY_LAG_S
from lakeshore.store import tallies
from lakeshore.store.tables import finished_tallies, invocations
from tests.conftest import FakeClock
from tests.integration.test_api_workers import claim, hello, submit
from tests.integration.test_retention import NS, Served, W, queue, served, sweep

__all__ = ["served"]  # the fixture, shared with the retention tests

FAIL = {"error": {"type": "E", "message": "no"}, "retry": False}


async def truth(served: Served, name: str) -> dict[str, int]:
    """Every row of the queue, counted the slow way."""
    _, state = served
    async with state.store.read() as conn:
        query = (
            select(invocations.c.state, func.count())
            .where(invocations.c.queue_name == name)
            .group_by(invocations.c.state)
        )
        return {s: int(n) for s, n in (await conn.execute(query)).all()}


async def by_state(served: Served, name: str) -> dict[str, int]:
    api, _ = served
    stats = await api.get(f"{NS}/queues/{name}/stats")
    assert stats.status_code == 200, stats.text
    return {s: n for s, n in stats.json()["byState"].items() if n}


async def test_by_state_stays_exact_through_tallies_deletes_and_retries(
    served: Served, clock: FakeClock
) -> None:
    api, state = served
    await queue(api, "t", retention_s=600)
    worker = await hello(api, ["t"], capacity=1000)
    rng = random.Random(7)
    for step in range(12):
        made = [(await submit(api, "t"))["id"] for _ in range(rng.randint(3, 12))]
        claimed = [c["id"] for c in await claim(api, worker, max=rng.randint(1, len(made)))]
        for invocation_id in claimed:
            kind = rng.choice(["complete", "fail", "leave"])
            if kind == "complete":
                done = await api.post(
                    f"{W}/{worker}/invocations/{invocation_id}/complete", json={"result": step}
                )
                assert done.status_code == 200, done.text
            elif kind == "fail":
                done = await api.post(f"{W}/{worker}/invocations/{invocation_id}/fail", json=FAIL)
                assert done.is_success, done.text
        for invocation_id in made:
            if invocation_id not in claimed and rng.random() < 0.3:
                assert (await api.post(f"{NS}/invocations/{invocation_id}/cancel")).is_success
        clock.advance(rng.choice([5.0, TALLY_LAG_S + 1, 200.0]))
        if rng.random() < 0.6:
            await sweep(state, clock)  # tallies, and deletes past the queue's window
        if rng.random() < 0.4:
            retried = await api.post(f"{NS}/queues/t/invocations/retry", json={"state": "failed"})
            assert retried.status_code == 200, retried.text
        assert await by_state(served, "t") == await truth(served, "t"), f"step {step}"

    async with state.store.read() as conn:
        tally = (await conn.execute(select(finished_tallies))).mappings().one()
        until = await tallies.counted_until(conn, tally["queue_id"])
    assert until is not None and until <= clock() - timedelta(seconds=TALLY_LAG_S)
    assert sum(tally[s] for s in tallies.STATES) > 0  # the finished rows are tallied


async def test_a_tallied_queue_reads_only_the_rows_finished_since(
    served: Served, clock: FakeClock
) -> None:
    """Rows finished before ``counted_until`` are counted from the tally: changing one
    behind the tally's back (which no path does) shows in ``byState`` only through the
    tally, which proves the live read left it out."""
    api, state = served
    await queue(api, "h")
    ids = [(await submit(api, "h"))["id"] for _ in range(5)]
    for invocation_id in ids:
        assert (await api.post(f"{NS}/invocations/{invocation_id}/cancel")).is_success
    clock.advance(TALLY_LAG_S + 1)
    await sweep(state, clock)  # tallies the five (the server's window keeps them)
    assert await by_state(served, "h") == {"cancelled": 5}
    async with state.store.write() as conn:
        await conn.execute(
            invocations.update().where(invocations.c.id == ids[0]).values(state="expired")
        )
    # the tally still says five cancelled: the changed row was not read again
    assert await by_state(served, "h") == {"cancelled": 5}
    fresh = (await submit(api, "h"))["id"]
    assert (await api.post(f"{NS}/invocations/{fresh}/cancel")).is_success
    assert await by_state(served, "h") == {"cancelled": 6}  # since the tally: read live


async def test_rows_deleted_before_the_tally_counted_them_leave_it_as_it_was(
    served: Served, clock: FakeClock
) -> None:
    """A window shorter than the tally's lag: the sweep deletes rows no roll-up counted
    yet, and takes nothing off the tally for them; older, counted ones come off it."""
    api, state = served
    await queue(api, "brief", retention_s=5)
    old = (await submit(api, "brief"))["id"]
    assert (await api.post(f"{NS}/invocations/{old}/cancel")).is_success
    clock.advance(TALLY_LAG_S + 1)
    await queue(api, "other")  # a second queue's sweep step between, as in any sweep
    young = (await submit(api, "brief"))["id"]
    assert (await api.post(f"{NS}/invocations/{young}/cancel")).is_success
    clock.advance(6)  # the young one is past its window, not yet tallied; the old one both

    deleted = await sweep(state, clock)

    assert deleted.invocations == 2
    assert await by_state(served, "brief") == await truth(served, "brief") == {}
    async with state.store.read() as conn:
        tally = (await conn.execute(select(finished_tallies))).mappings().all()
    assert [t["cancelled"] for t in tally if t["cancelled"]] == []  # the old one came off
