"""periodic schedules

A schedule belongs to a queue and submits a function there at each slot of its cron
expression or interval. The row keeps the definition and the last slot the leader dealt
with, so a new leader carries on where the old one stopped.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07 13:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import lakeshore.store.types

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("namespace_id", sa.String(length=40), nullable=False),
        sa.Column("queue_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("last_slot", lakeshore.store.types.UTCDateTime(timezone=True), nullable=False),
        sa.Column("created_at", lakeshore.store.types.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", lakeshore.store.types.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["namespace_id"],
            ["namespaces.id"],
            name=op.f("fk_schedules_namespace_id_namespaces"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["queue_id"],
            ["queues.id"],
            name=op.f("fk_schedules_queue_id_queues"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_schedules")),
        sa.UniqueConstraint("queue_id", "name", name=op.f("uq_schedules_queue_id_name")),
    )
    op.create_index(op.f("ix_schedules_enabled"), "schedules", ["enabled"])


def downgrade() -> None:
    op.drop_index(op.f("ix_schedules_enabled"), table_name="schedules")
    op.drop_table("schedules")
