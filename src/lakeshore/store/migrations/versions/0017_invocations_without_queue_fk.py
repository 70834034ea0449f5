"""invocations without a foreign key to their queue

Each row a submit inserts was checked against ``invocations.queue_id → queues``: in a
batch of 1,000 on PostgreSQL the check took ~2.5 ms of the statement's ~9 (a trigger per
row), the largest single part after the index writes. The key guarded nothing the
submits do not hold already: every insert reads its queue row in the same transaction
and holds it (the full path locks it; a submit decided on a known copy of the queue
holds it ``FOR SHARE`` in its one statement, and inserts nothing if it is gone or has
changed), and queues are archived, never deleted (no route, service or store function
deletes one), so its ``ON DELETE CASCADE`` never fired either. The column and its
indexes stay; ``docs/architecture.md`` says why there is no key.

On SQLite a foreign key cannot be dropped in place: the table is rebuilt as 0007 did
(batch mode, the priority index on an expression dropped before and made again after,
foreign keys checked before the migration commits).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-07 23:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_PENDING = sa.text("state = 'pending'")
_QUEUE_FK = "fk_invocations_queue_id_queues"


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
        batch_op.drop_constraint(_QUEUE_FK, type_="foreignkey")
    if _sqlite():
        _priority_index()
    _check_foreign_keys()


def downgrade() -> None:
    with op.batch_alter_table("invocations", schema=None) as batch_op:
        if _sqlite():
            batch_op.drop_index("ix_invocations_claimable_priority")
        batch_op.create_foreign_key(_QUEUE_FK, "queues", ["queue_id"], ["id"], ondelete="CASCADE")
    if _sqlite():
        _priority_index()
    _check_foreign_keys()
