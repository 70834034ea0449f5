"""invocation listing indexes

A queue's invocations are listed newest first, a page at a time by keyset
(``created_at``, ``id``), with or without a state filter: with a million invocations in
a queue, a page without an index on that order sorted every row of the queue. The
``(queue_id, state)`` index becomes ``(queue_id, state, created_at, id)``, which serves
the per-state counts as before and the filtered pages; ``(queue_id, created_at, id)``
serves the unfiltered ones.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-05 13:00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("invocations", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_invocations_queue_id_state_created_at_id"),
            ["queue_id", "state", "created_at", "id"],
            unique=False,
        )
        batch_op.create_index(
            batch_op.f("ix_invocations_queue_id_created_at_id"),
            ["queue_id", "created_at", "id"],
            unique=False,
        )
        batch_op.drop_index(batch_op.f("ix_invocations_queue_id_state"))


def downgrade() -> None:
    with op.batch_alter_table("invocations", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_invocations_queue_id_state"), ["queue_id", "state"], unique=False
        )
        batch_op.drop_index(batch_op.f("ix_invocations_queue_id_created_at_id"))
        batch_op.drop_index(batch_op.f("ix_invocations_queue_id_state_created_at_id"))
