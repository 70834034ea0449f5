"""A submit's one statement goes through whatever Statements it is given
(store/statements.py): the caller names the statement and its values; the store's own
implementation picks the SQL and makes its parameters."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from lakeshore.store import invocations as inv_store
from lakeshore.store.statements import OneStatement, Parameters

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


class FakeStatements:
    """Statements that answer with ``rows`` and remember what they were asked."""

    def __init__(self, rows: Sequence[tuple[Any, ...]]) -> None:
        self.rows = rows
        self.asked: list[tuple[OneStatement, Parameters]] = []

    async def fetch(
        self, statement: OneStatement, parameters: Parameters
    ) -> Sequence[tuple[Any, ...]]:
        self.asked.append((statement, parameters))
        return self.rows


def _row(**changes: Any) -> dict[str, Any]:
    """A submit's row: its own columns (those unset None) and its queue's."""
    own = {"id": "inv_1", "fn": "m:f", "args": [1], "kwargs": {}, "priority": 0.0}
    shared = {"namespace_id": "ns_default", "queue_id": "q_1", "queue_name": "q"}
    return {
        **dict.fromkeys(inv_store.OWN),
        **own,
        "max_attempts": 3,
        **shared,
        **{"state": "pending", "attempts": 0, "available_at": NOW, "created_at": NOW},
        **changes,
    }


async def test_a_submit_is_one_statement_of_whatever_statements_it_is_given() -> None:
    went_in = FakeStatements([("inv_1",)])
    stored = await inv_store.insert_at(went_in, [_row()], 7)
    assert stored is not None and stored[0]["id"] == "inv_1" and stored[0]["worker_id"] is None
    [(statement, given)] = went_in.asked
    assert statement.name == "submit" and given == {"rows": [_row()], "revision": 7}
    assert await inv_store.insert_at(FakeStatements([]), [_row()], 7) is None


async def test_a_batch_without_keys_is_one_statement_too_and_one_with_keys_is_not() -> None:
    rows = [_row(id="inv_1"), _row(id="inv_2")]
    went_in = FakeStatements([("inv_1",), ("inv_2",)])
    stored = await inv_store.insert_at(went_in, rows, 7)
    assert stored is not None and [row["id"] for row in stored] == ["inv_1", "inv_2"]
    keyed = [_row(id="inv_1", key="a"), _row(id="inv_2")]
    with pytest.raises(ValueError, match="keys"):
        await inv_store.insert_at(FakeStatements([]), keyed, 7)


async def test_a_handed_submit_is_leased_when_the_statement_says_running() -> None:
    handed = FakeStatements([("running",)])
    stored = await inv_store.insert_one_handed(
        handed, _row(), 7, worker_id="wrk_1", holds=2, lease_s=30
    )
    assert stored is not None
    assert (stored["state"], stored["worker_id"], stored["attempts"]) == ("running", "wrk_1", 1)
    pending = await inv_store.insert_one_handed(
        FakeStatements([("pending",)]), _row(), 7, worker_id="wrk_1", holds=2, lease_s=30
    )
    assert pending is not None and pending["state"] == "pending"


def test_each_store_makes_its_own_parameters_of_the_same_values() -> None:
    """PostgreSQL adds each row's offset to the first row's time and notifies; SQLite
    reads each row's time as its column keeps it (fixed-width text)."""
    given: Parameters = {"rows": [_row()], "revision": 7}
    submit = inv_store._SUBMIT
    assert submit.for_postgresql is not None and submit.for_sqlite is not None
    pg, lite = submit.for_postgresql(given), submit.for_sqlite(given)
    assert (pg["revision"], lite["revision"]) == (7, 7)
    assert pg["created_at"] == NOW and "channel" in pg
    assert [row["us"] for row in json.loads(pg["rows"])] == [0]
    assert "created_at" not in lite and "channel" not in lite
    assert [row["created_at"] for row in json.loads(lite["rows"])] == ["2026-01-01 12:00:00.000000"]
