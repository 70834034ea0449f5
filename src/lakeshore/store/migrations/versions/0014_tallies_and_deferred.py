"""finished tallies per queue, and an index of deferred pending work by due time

``stats`` counted a queue's invocations by state by reading every row the queue ever had,
so it slowed as history grew. The leading server now adds up each queue's finished
invocations, up to a moment a little in the past, into ``finished_tallies``; ``stats``
reads the tally, the live states and only the rows finished since.

A waiting claim looked for the next due time of deferred work (a retry's backoff, a
delayed submit) by reading pending rows through the claim's index. A partial index holds
only pending rows due after their own submit (``available_at > created_at``), which a
plain submit never is, so it costs a plain submit nothing and answers exactly.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07 16:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import lakeshore.store.types

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_DEFERRED = sa.text("state = 'pending' AND available_at > created_at")


def upgrade() -> None:
    op.create_table(
        "finished_tallies",
        sa.Column("queue_id", sa.String(length=40), nullable=False),
        sa.Column(
            "counted_until", lakeshore.store.types.UTCDateTime(timezone=True), nullable=False
        ),
        sa.Column("succeeded", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
        sa.Column("failed", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
        sa.Column("cancelled", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
        sa.Column("expired", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
        sa.ForeignKeyConstraint(
            ["queue_id"],
            ["queues.id"],
            name=op.f("fk_finished_tallies_queue_id_queues"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("queue_id", name=op.f("pk_finished_tallies")),
    )
    op.create_index(
        "ix_invocations_deferred",
        "invocations",
        ["queue_id", "available_at"],
        unique=False,
        sqlite_where=_DEFERRED,
        postgresql_where=_DEFERRED,
    )


def downgrade() -> None:
    op.drop_index("ix_invocations_deferred", table_name="invocations")
    op.drop_table("finished_tallies")
