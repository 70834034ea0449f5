"""lighter invocation inserts

Each row a submit inserts was checked against two foreign keys and written into the
``(queue_id, key)`` unique index; in a batch of 1,000 on PostgreSQL the two checks alone
took ~6 ms of ~14. Two of those costs did no work of their own:

- ``invocations.namespace_id → namespaces`` repeats what ``queue_id → queues`` already
  holds: a row's namespace is its queue's (a submit writes the one it found the queue
  in, and a queue never changes namespace), and ``queues.namespace_id → namespaces`` is
  ``ON DELETE CASCADE`` as ``invocations.queue_id → queues`` is, so a namespace's
  invocations still go with it, by way of its queues. The column stays (it is how an
  invocation is read in its namespace); its foreign key goes.
- the unique ``(queue_id, key)`` held a row for every invocation, though only keyed ones
  can conflict (NULLs never do): it becomes a unique index over the rows with a key.
  Submits name the same predicate in ``ON CONFLICT`` (see
  ``lakeshore.store.invocations``), as both stores need to match a partial index.

On SQLite neither a foreign key nor a table constraint can be dropped in place, so the
table is rebuilt (Alembic's batch mode: copied into a new table, the old one dropped,
the new one renamed, the indexes created again). :func:`lakeshore.store.engine.migrate`
runs migrations with SQLite's foreign keys off, as SQLite asks for a rebuild: with them
on, dropping the old table would first delete its rows, and with them each invocation's
stream items (``ON DELETE CASCADE``). The keys are checked before the migration commits.
Batch mode copies the indexes, but not one on an expression (``priority DESC`` of
``ix_invocations_claimable_priority``): that one is dropped before and made again after.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-07 02:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_HAS_KEY = sa.text("key IS NOT NULL")
_PENDING = sa.text("state = 'pending'")
_NAMESPACE_FK = "fk_invocations_namespace_id_namespaces"
_KEY_UNIQUE = "uq_invocations_queue_id_key"
_KEY_INDEX = "ix_invocations_queue_id_key"


def _sqlite() -> bool:
    return bool(op.get_bind().dialect.name == "sqlite")


def _priority_index() -> None:
    """The priority index, made again after SQLite's rebuild (which cannot copy it)."""
    op.create_index(
        "ix_invocations_claimable_priority",
        "invocations",
        ["queue_id", sa.literal_column("priority DESC"), "created_at", "id"],
        unique=False,
        sqlite_where=_PENDING,
        postgresql_where=_PENDING,
    )


def _check_foreign_keys() -> None:
    """On SQLite, where the rebuild ran with foreign keys off: refuse (and so roll back)
    a table whose rows break one."""
    if not _sqlite():
        return
    broken = op.get_bind().exec_driver_sql("PRAGMA foreign_key_check").all()
    if broken:
        tables = ", ".join(sorted({str(row[0]) for row in broken}))
        raise RuntimeError(f"rows that break a foreign key in: {tables}")


def upgrade() -> None:
    with op.batch_alter_table("invocations", schema=None) as batch_op:
        if _sqlite():
            batch_op.drop_index("ix_invocations_claimable_priority")
        batch_op.drop_constraint(_NAMESPACE_FK, type_="foreignkey")
        batch_op.create_index(
            _KEY_INDEX,
            ["queue_id", "key"],
            unique=True,
            sqlite_where=_HAS_KEY,
            postgresql_where=_HAS_KEY,
        )
        batch_op.drop_constraint(_KEY_UNIQUE, type_="unique")
    if _sqlite():
        _priority_index()
    _check_foreign_keys()


def downgrade() -> None:
    with op.batch_alter_table("invocations", schema=None) as batch_op:
        if _sqlite():
            batch_op.drop_index("ix_invocations_claimable_priority")
        batch_op.create_unique_constraint(_KEY_UNIQUE, ["queue_id", "key"])
        batch_op.drop_index(_KEY_INDEX)
        batch_op.create_foreign_key(
            _NAMESPACE_FK, "namespaces", ["namespace_id"], ["id"], ondelete="CASCADE"
        )
    if _sqlite():
        _priority_index()
    _check_foreign_keys()
