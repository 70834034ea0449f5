"""retention: a queue's own window, and the indexes the sweep reads

Nothing deleted a finished invocation, its stream items or a decision event, so the store
grew with every job. The leading server now deletes them once past their retention, a
batch at a time. A queue may set its own window (``retention_s``, null: the server's).
The sweep reads a queue's finished invocations oldest first through a partial index over
the finished states only, ``(queue_id, finished_at)``: it reads the rows it deletes and
nothing else, however many are pending or running; events are read by ``created_at``.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-07 13:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_FINISHED = sa.text("state IN ('succeeded', 'failed', 'cancelled', 'expired')")


def upgrade() -> None:
    with op.batch_alter_table("queues", schema=None) as batch_op:
        batch_op.add_column(sa.Column("retention_s", sa.Float(), nullable=True))
    op.create_index(
        "ix_invocations_finished",
        "invocations",
        ["queue_id", "finished_at"],
        unique=False,
        sqlite_where=_FINISHED,
        postgresql_where=_FINISHED,
    )
    op.create_index(op.f("ix_elasticity_events_created_at"), "elasticity_events", ["created_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_elasticity_events_created_at"), table_name="elasticity_events")
    op.drop_index("ix_invocations_finished", table_name="invocations")
    with op.batch_alter_table("queues", schema=None) as batch_op:
        batch_op.drop_column("retention_s")
