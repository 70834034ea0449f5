"""fewer invocation indexes

Every submit writes a row into each index of ``invocations``, and a batch of 1,000 spent
most of its time in the database on them. Two did no work of their own:

- ``ix_invocations_claimable`` (``queue_id, created_at, id`` over pending rows) repeats
  ``ix_invocations_queue_id_state_created_at_id`` for ``state = 'pending'``: a claim's
  ``queue_id = ? AND state = 'pending' ORDER BY created_at, id`` walks the wider index
  in the same order (backwards for filo), so the partial copy goes.
- ``ix_invocations_worker_id`` held every row, though a submit's has no worker and every
  query on it asks for one worker (``worker_id = ?``, which implies ``IS NOT NULL``): it
  now holds only the rows that have one.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-06 02:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_HAS_WORKER = sa.text("worker_id IS NOT NULL")
_PENDING = sa.text("state = 'pending'")


def upgrade() -> None:
    with op.batch_alter_table("invocations", schema=None) as batch_op:
        batch_op.drop_index("ix_invocations_claimable")
        batch_op.drop_index("ix_invocations_worker_id")
        batch_op.create_index(
            "ix_invocations_worker_id",
            ["worker_id"],
            unique=False,
            sqlite_where=_HAS_WORKER,
            postgresql_where=_HAS_WORKER,
        )


def downgrade() -> None:
    with op.batch_alter_table("invocations", schema=None) as batch_op:
        batch_op.drop_index("ix_invocations_worker_id")
        batch_op.create_index("ix_invocations_worker_id", ["worker_id"], unique=False)
        batch_op.create_index(
            "ix_invocations_claimable",
            ["queue_id", "created_at", "id"],
            unique=False,
            sqlite_where=_PENDING,
            postgresql_where=_PENDING,
        )
