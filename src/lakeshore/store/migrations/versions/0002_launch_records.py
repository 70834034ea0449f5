"""launch records: the launch body, termination, the launch's token; the scale feed index

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02 20:05:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import lakeshore.store.types

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("launches", schema=None) as batch_op:
        batch_op.add_column(sa.Column("body", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("token_id", sa.String(length=40), nullable=True))
        batch_op.add_column(
            sa.Column(
                "terminated_at",
                lakeshore.store.types.UTCDateTime(timezone=True),
                nullable=True,
            )
        )
        batch_op.add_column(sa.Column("terminate_error", sa.Text(), nullable=True))
        batch_op.create_index(batch_op.f("ix_launches_worker_id"), ["worker_id"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_launches_namespace_id_provider_name_id"),
            ["namespace_id", "provider_name", "id"],
            unique=False,
        )
    with op.batch_alter_table("elasticity_events", schema=None) as batch_op:
        batch_op.create_index(
            "ix_elasticity_events_scale_feed",
            ["namespace_id", "queue_name", "id"],
            unique=False,
            sqlite_where=sa.text("action <> 'tick_noop'"),
            postgresql_where=sa.text("action <> 'tick_noop'"),
        )
        batch_op.create_index(
            "ix_elasticity_events_noop_age",
            ["created_at"],
            unique=False,
            sqlite_where=sa.text("action = 'tick_noop'"),
            postgresql_where=sa.text("action = 'tick_noop'"),
        )


def downgrade() -> None:
    with op.batch_alter_table("elasticity_events", schema=None) as batch_op:
        batch_op.drop_index("ix_elasticity_events_noop_age")
        batch_op.drop_index("ix_elasticity_events_scale_feed")
    with op.batch_alter_table("launches", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_launches_namespace_id_provider_name_id"))
        batch_op.drop_index(batch_op.f("ix_launches_worker_id"))
        batch_op.drop_column("terminate_error")
        batch_op.drop_column("terminated_at")
        batch_op.drop_column("token_id")
        batch_op.drop_column("body")
