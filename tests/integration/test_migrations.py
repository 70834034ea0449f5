"""Migrations over a store that holds rows, on SQLite and PostgreSQL: an upgrade in place
keeps every row, and leaves the schema the tables describe."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Connection, Engine, create_engine, delete, insert, inspect, pool, select
from sqlalchemy.exc import IntegrityError

from lakeshore.store.engine import _alembic_config, _sqlite_setup, migrate, parse_url
from lakeshore.store.tables import (
    finished_tallies,
    invocations,
    metadata,
    namespaces,
    queues,
    rate_buckets,
    stream_items,
    tokens,
    ui_sessions,
)
from tests.conftest import BACKENDS, create_pg_database, drop_pg_database

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


@pytest.fixture(params=BACKENDS)
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A store never migrated, on each backend in turn."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'lakeshore.db'}"
        return
    server: str = request.getfixturevalue("pg_server")
    url = create_pg_database(server)
    yield url
    drop_pg_database(server, url)


def _engine(url: str, *, foreign_keys: bool = True) -> Engine:
    engine = create_engine(parse_url(url), poolclass=pool.NullPool)
    if engine.dialect.name == "sqlite":
        _sqlite_setup(engine, foreign_keys=foreign_keys)
    return engine


def _alembic(url: str, action: str, revision: str) -> None:
    """Up or down to ``revision``, as :func:`migrate` runs migrations (on SQLite with
    foreign keys off, as a rebuild needs)."""
    engine = _engine(url, foreign_keys=False)
    cfg = _alembic_config()
    with engine.connect() as conn:
        cfg.attributes["connection"] = conn
        getattr(command, action)(cfg, revision)
        conn.commit()
    engine.dispose()


def _invocation(id: str, queue: str, key: str | None, **more: Any) -> dict[str, Any]:
    return {
        "id": id,
        "namespace_id": f"ns_{queue}",
        "queue_id": f"q_{queue}",
        "queue_name": queue,
        "fn": "m:f",
        "args": [1, "two"],
        "kwargs": {"priority": 3},
        "priority": 3.0,
        "key": key,
        "state": "pending",
        "attempts": 0,
        "max_attempts": 3,
        "available_at": NOW,
        "created_at": NOW,
        **more,
    }


def _fill(conn: Connection) -> None:
    for name in ("a", "b"):
        conn.execute(insert(namespaces).values(id=f"ns_{name}", name=name, created_at=NOW))
        conn.execute(
            insert(queues).values(
                id=f"q_{name}",
                namespace_id=f"ns_{name}",
                name=name,
                kind="fifo",
                state="active",
                created_at=NOW,
                updated_at=NOW,
            )
        )
    conn.execute(
        insert(invocations),
        [
            _invocation("inv_1", "a", "k1"),
            _invocation("inv_2", "a", None),
            _invocation("inv_3", "a", None, state="succeeded", result={"ok": True}),
            _invocation("inv_4", "b", "k1", worker_id="w_1", state="running"),
        ],
    )
    conn.execute(
        insert(stream_items),
        [
            {"invocation_id": "inv_1", "seq": seq, "item": {"n": seq}, "created_at": NOW}
            for seq in range(2)
        ],
    )


# columns added after the earliest revision these tests start from (0006): compared by
# the tests of the migration that adds them
_LATER = {
    ("invocations", "begun_attempt"),  # 0009
    ("queues", "retention_s"),  # 0011
    ("invocations", "schedule"),  # 0013
    ("invocations", "slot"),  # 0013
    ("invocations", "retry"),  # 0015
    ("invocations", "concurrency_key"),  # 0015
    ("queues", "retry"),  # 0015
}
_LATER_INDEXES = {  # 0011, 0014, 0015, 0016
    "ix_invocations_finished",
    "ix_invocations_deferred",
    "ix_invocations_running_key",
    "ix_invocations_pending_key",
}


def _contents(conn: Connection) -> dict[str, list[Any]]:
    contents: dict[str, list[Any]] = {}
    for table in (namespaces, queues, invocations, stream_items):
        columns = [c for c in table.c if (table.name, c.name) not in _LATER]
        query = select(*columns).order_by(*table.primary_key)
        contents[table.name] = [tuple(row) for row in conn.execute(query)]
    return contents


def _filled_then_migrated(
    url: str, revision: str, to: str | None = None
) -> tuple[Engine, dict[str, Any]]:
    """The store at ``revision``, filled, then migrated to ``to`` (the head unless
    given): its engine, and its contents before the migration."""
    _alembic(url, "upgrade", revision)
    engine = _engine(url)
    with engine.begin() as conn:
        _fill(conn)
        before = _contents(conn)
    if to is None:
        migrate(parse_url(url))
    else:
        _alembic(url, "upgrade", to)
    return engine, before


def _index_definitions(conn: Connection) -> dict[str, str]:
    """Each index of ``invocations`` as the database itself writes it."""
    if conn.dialect.name == "sqlite":
        query = "SELECT name, sql FROM sqlite_master WHERE tbl_name = 'invocations'"
    else:
        query = "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'invocations'"
    return {str(name): str(sql) for name, sql in conn.exec_driver_sql(query).all() if sql}


def test_0007_keeps_every_row_and_drops_the_namespace_key(empty_url: str) -> None:
    engine, before = _filled_then_migrated(empty_url, "0006")

    with engine.begin() as conn:
        assert _contents(conn) == before  # stream items included: nothing cascaded
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []
        schema = inspect(conn)
        referred = [fk["referred_table"] for fk in schema.get_foreign_keys("invocations")]
        assert "namespaces" not in referred  # (and since 0017, no key to "queues" either)
        indexes = {ix["name"]: ix for ix in schema.get_indexes("invocations")}
        assert indexes["ix_invocations_queue_id_key"]["unique"]
        assert {
            "ix_invocations_claimable_priority",
            "ix_invocations_queue_id_state_created_at_id",
            "ix_invocations_queue_id_created_at_id",
            "ix_invocations_leases",
            "ix_invocations_worker_state",  # 0008's, made from 0007's worker index
        } <= set(indexes)
        if conn.dialect.name == "sqlite":  # the rebuild kept each index's own definition
            made = dict(conn.exec_driver_sql("SELECT name, sql FROM sqlite_master").all())
            assert "priority DESC" in made["ix_invocations_claimable_priority"]
            assert "WHERE key IS NOT NULL" in made["ix_invocations_queue_id_key"]
            assert "WHERE state = 'running'" in made["ix_invocations_leases"]
    engine.dispose()


def test_0007_a_used_key_is_refused_and_a_namespace_still_takes_its_invocations(
    empty_url: str,
) -> None:
    engine, _ = _filled_then_migrated(empty_url, "0006", to="0007")

    with pytest.raises(IntegrityError), engine.begin() as conn:
        conn.execute(insert(invocations).values(_invocation("inv_6", "a", "k1")))
    with engine.begin() as conn:
        conn.execute(insert(invocations).values(_invocation("inv_7", "a", None)))
        conn.execute(insert(invocations).values(_invocation("inv_8", "a", "k2")))
        # by way of its queues (the invocations' own namespace key is gone)
        conn.execute(delete(namespaces).where(namespaces.c.id == "ns_a"))
        left = conn.execute(select(invocations.c.id).order_by(invocations.c.id)).scalars()
        assert list(left) == ["inv_4"]
        assert conn.execute(select(stream_items)).all() == []  # inv_1's went with it
    engine.dispose()


def test_0007_downgrades_and_upgrades_again_with_the_rows(empty_url: str) -> None:
    migrate(parse_url(empty_url))
    engine = _engine(empty_url)
    with engine.begin() as conn:
        _fill(conn)
        before = _contents(conn)

    _alembic(empty_url, "downgrade", "0006")
    with engine.begin() as conn:
        assert _contents(conn) == before
        schema = inspect(conn)
        assert sorted(fk["referred_table"] for fk in schema.get_foreign_keys("invocations")) == [
            "namespaces",
            "queues",
        ]
        assert [uq["column_names"] for uq in schema.get_unique_constraints("invocations")] == [
            ["queue_id", "key"]
        ]

    migrate(parse_url(empty_url))
    with engine.begin() as conn:
        assert _contents(conn) == before
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []
    engine.dispose()


def test_0008_keeps_every_row_and_indexes_a_worker_s_rows_by_state(empty_url: str) -> None:
    engine, before = _filled_then_migrated(empty_url, "0007")

    with engine.begin() as conn:
        assert _contents(conn) == before
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []
        indexes = {ix["name"]: ix for ix in inspect(conn).get_indexes("invocations")}
        assert "ix_invocations_worker_id" not in indexes
        assert indexes["ix_invocations_worker_state"]["column_names"] == ["worker_id", "state"]
        made = _index_definitions(conn)["ix_invocations_worker_state"]
        assert "worker_id IS NOT NULL" in made, made  # still only the rows with a worker
    _alembic(empty_url, "downgrade", "0007")  # and back, rows kept
    with engine.begin() as conn:
        assert _contents(conn) == before
        made_back = _index_definitions(conn)
        assert "ix_invocations_worker_state" not in made_back
        assert "worker_id IS NOT NULL" in made_back["ix_invocations_worker_id"]
        assert "state" not in made_back["ix_invocations_worker_id"]
    engine.dispose()


def test_0009_adds_the_begun_attempt_and_keeps_every_row(empty_url: str) -> None:
    engine, before = _filled_then_migrated(empty_url, "0008")

    with engine.begin() as conn:
        assert _contents(conn) == before
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []
        begun = conn.execute(select(invocations.c.begun_attempt)).scalars().all()
        assert begun == [None] * 4  # not known to have begun
        indexes = set(_index_definitions(conn)) - _LATER_INDEXES
    _alembic(empty_url, "downgrade", "0008")  # and back, rows and indexes kept
    with engine.begin() as conn:
        assert _contents(conn) == before
        columns = {c["name"] for c in inspect(conn).get_columns("invocations")}
        assert "begun_attempt" not in columns
        assert set(_index_definitions(conn)) == indexes
    engine.dispose()


def test_0010_adds_the_dashboard_sessions_and_keeps_every_row(empty_url: str) -> None:
    engine, before = _filled_then_migrated(empty_url, "0009")

    with engine.begin() as conn:
        assert _contents(conn) == before
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []
        conn.execute(
            insert(tokens).values(
                id="t_1",
                namespace_id="ns_a",
                kind="namespace",
                secret_hash="0" * 64,
                created_at=NOW,
            )
        )
        conn.execute(
            insert(ui_sessions),
            [
                {"id_hash": "a" * 64, "token_id": "t_1", "created_at": NOW, "expires_at": NOW},
                {"id_hash": "b" * 64, "token_id": None, "created_at": NOW, "expires_at": NOW},
            ],
        )
        with pytest.raises(IntegrityError), conn.begin_nested():  # a token of the store's
            conn.execute(
                insert(ui_sessions).values(
                    id_hash="c" * 64, token_id="t_nowhere", created_at=NOW, expires_at=NOW
                )
            )
    _alembic(empty_url, "downgrade", "0009")  # and back, every other row kept
    with engine.begin() as conn:
        assert _contents(conn) == before
        assert "ui_sessions" not in inspect(conn).get_table_names()
    migrate(parse_url(empty_url))
    with engine.begin() as conn:
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []
    engine.dispose()


def test_0011_adds_the_retention_window_and_the_sweeps_index_keeping_every_row(
    empty_url: str,
) -> None:
    engine, before = _filled_then_migrated(empty_url, "0010")

    with engine.begin() as conn:
        assert _contents(conn) == before
        assert set(conn.execute(select(queues.c.retention_s)).scalars()) == {None}
        made = _index_definitions(conn)["ix_invocations_finished"]
        assert "'succeeded'" in made and "'expired'" in made, made  # finished rows only
    _alembic(empty_url, "downgrade", "0010")  # and back, rows kept
    with engine.begin() as conn:
        assert _contents(conn) == before
        assert "ix_invocations_finished" not in _index_definitions(conn)
        columns = {c["name"] for c in inspect(conn).get_columns("queues")}
        assert "retention_s" not in columns
    engine.dispose()


def test_0014_adds_the_tallies_and_the_deferred_index_keeping_every_row(empty_url: str) -> None:
    engine, before = _filled_then_migrated(empty_url, "0013")

    with engine.begin() as conn:
        assert _contents(conn) == before
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []
        assert conn.execute(select(finished_tallies)).all() == []  # tallied by the leader
        made = _index_definitions(conn)["ix_invocations_deferred"]
        assert "available_at > created_at" in made, made  # deferred pending rows only
    _alembic(empty_url, "downgrade", "0013")  # and back, rows kept
    with engine.begin() as conn:
        assert _contents(conn) == before
        assert "ix_invocations_deferred" not in _index_definitions(conn)
        assert "finished_tallies" not in inspect(conn).get_table_names()
    engine.dispose()


def test_0015_adds_retry_policies_keys_and_rate_buckets_keeping_every_row(
    empty_url: str,
) -> None:
    engine, before = _filled_then_migrated(empty_url, "0014")

    with engine.begin() as conn:
        assert _contents(conn) == before
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []
        kept = conn.execute(select(invocations.c.retry, invocations.c.concurrency_key)).all()
        assert kept and all(row == (None, None) for row in kept)  # the default policy, no key
        assert conn.execute(select(rate_buckets)).all() == []
        made = _index_definitions(conn)["ix_invocations_running_key"]
        assert "concurrency_key IS NOT NULL" in made, made  # keyed running rows only
    _alembic(empty_url, "downgrade", "0014")  # and back, rows kept
    with engine.begin() as conn:
        assert _contents(conn) == before
        assert "ix_invocations_running_key" not in _index_definitions(conn)
        assert "rate_buckets" not in inspect(conn).get_table_names()
        columns = {c["name"] for c in inspect(conn).get_columns("invocations")}
        assert not columns & {"retry", "concurrency_key"}
        assert "retry" not in {c["name"] for c in inspect(conn).get_columns("queues")}
    engine.dispose()


def test_0016_indexes_pending_keyed_rows_keeping_every_row(empty_url: str) -> None:
    engine, before = _filled_then_migrated(empty_url, "0015")

    with engine.begin() as conn:
        assert _contents(conn) == before
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []
        made = _index_definitions(conn)["ix_invocations_pending_key"]
        assert "concurrency_key IS NOT NULL" in made, made  # keyed pending rows only
    _alembic(empty_url, "downgrade", "0015")  # and back, rows kept
    with engine.begin() as conn:
        assert _contents(conn) == before
        assert "ix_invocations_pending_key" not in _index_definitions(conn)
    engine.dispose()


def test_0017_drops_the_invocations_queue_key_keeping_every_row(empty_url: str) -> None:
    engine, before = _filled_then_migrated(empty_url, "0016")

    with engine.begin() as conn:
        assert _contents(conn) == before  # stream items included: nothing cascaded
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []
        assert inspect(conn).get_foreign_keys("invocations") == []
        made = _index_definitions(conn)
        assert "DESC" in made["ix_invocations_claimable_priority"]  # made again on SQLite
        assert "concurrency_key IS NOT NULL" in made["ix_invocations_pending_key"]
    _alembic(empty_url, "downgrade", "0016")  # and back, rows kept, the key again
    with engine.begin() as conn:
        assert _contents(conn) == before
        referred = [fk["referred_table"] for fk in inspect(conn).get_foreign_keys("invocations")]
        assert referred == ["queues"]
    engine.dispose()
