"""queue revisions and folded no-ops

``queues.revision`` counts a queue's writes (its spec and its state): the controller
keeps parsed queues between ticks and reads again only those whose revision moved.
``elasticity_events.repeats`` and ``last_at`` fold consecutive identical no-ops of one
queue or pool into one row: the first tick's row, how many ticks decided the same, and
when the last of them did.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-04 12:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import lakeshore.store.types

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("queues", schema=None) as batch_op:
        batch_op.add_column(sa.Column("revision", sa.Integer(), server_default="0", nullable=False))
    with op.batch_alter_table("elasticity_events", schema=None) as batch_op:
        batch_op.add_column(sa.Column("repeats", sa.Integer(), server_default="1", nullable=False))
        batch_op.add_column(
            sa.Column("last_at", lakeshore.store.types.UTCDateTime(timezone=True), nullable=True)
        )


def downgrade() -> None:
    with op.batch_alter_table("elasticity_events", schema=None) as batch_op:
        batch_op.drop_column("last_at")
        batch_op.drop_column("repeats")
    with op.batch_alter_table("queues", schema=None) as batch_op:
        batch_op.drop_column("revision")
