"""Migration 0012 (periodic schedules) over a store that holds rows, on both backends."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import insert, inspect, select, update
from sqlalchemy.exc import IntegrityError

from lakeshore.store.engine import migrate, parse_url
from lakeshore.store.tables import invocations, metadata, schedules
from tests.integration.test_migrations import (  # noqa: F401  # empty_url is a fixture
    NOW,
    _alembic,
    _contents,
    _filled_then_migrated,
    empty_url,
)


def _schedule(id: str, name: str, queue_id: str = "q_a") -> dict[str, object]:
    return {
        "id": id,
        "namespace_id": "ns_a",
        "queue_id": queue_id,
        "name": name,
        "spec": {"name": name, "fn": "jobs:run", "every_s": 60.0},
        "enabled": True,
        "last_slot": NOW,
        "created_at": NOW,
        "updated_at": NOW,
    }


def test_0012_adds_the_schedules_and_keeps_every_row(empty_url: str) -> None:  # noqa: F811
    engine, before = _filled_then_migrated(empty_url, "0011")

    with engine.begin() as conn:
        assert _contents(conn) == before
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []
        conn.execute(insert(schedules).values(_schedule("sch_1", "nightly")))
        with pytest.raises(IntegrityError), conn.begin_nested():  # one name per queue
            conn.execute(insert(schedules).values(_schedule("sch_2", "nightly")))
        with pytest.raises(IntegrityError), conn.begin_nested():  # a queue of the store's
            conn.execute(insert(schedules).values(_schedule("sch_3", "x", "q_nowhere")))
    _alembic(empty_url, "downgrade", "0011")  # and back, every other row kept
    with engine.begin() as conn:
        assert _contents(conn) == before
        assert "schedules" not in inspect(conn).get_table_names()
    migrate(parse_url(empty_url))
    with engine.begin() as conn:
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []
    engine.dispose()


def test_0013_gives_invocations_a_schedule_and_slot_and_keeps_every_row(
    empty_url: str,  # noqa: F811
) -> None:
    engine, before = _filled_then_migrated(empty_url, "0012")
    with engine.begin() as conn:
        assert _contents(conn) == before
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []
        rows = conn.execute(select(invocations.c.schedule, invocations.c.slot)).all()
        assert rows and all(row == (None, None) for row in rows)
        conn.execute(
            update(invocations).where(invocations.c.id == "inv_1").values(schedule="s", slot=NOW)
        )
        assert (
            conn.execute(select(invocations.c.slot).where(invocations.c.id == "inv_1")).scalar_one()
            == NOW
        )
    _alembic(empty_url, "downgrade", "0012")
    with engine.begin() as conn:
        assert _contents(conn) == before
        names = {c["name"] for c in inspect(conn).get_columns("invocations")}
        assert not names & {"schedule", "slot"}
    migrate(parse_url(empty_url))
    engine.dispose()
