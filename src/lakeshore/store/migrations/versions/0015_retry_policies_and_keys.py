"""retry policies (a queue's, an invocation's), concurrency keys, and rate buckets
shared by replicas

``queues.retry`` holds the queue's retry policy as written (each field optional).

``invocations.retry`` holds the invocation's effective retry policy, fixed at submit (null: the
default policy, with the row's ``max_attempts``). ``concurrency_key`` is the key a
queue's ``max_running_per_key`` counts and a claim takes turns by; its running rows are
indexed by queue and key, so counting them reads only them.

``rate_buckets`` keeps a token bucket per queue (``key`` empty) and per concurrency key,
updated in the submit's transaction, so every replica admits from the same bucket.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07 20:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import lakeshore.store.types

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_RUNNING_KEYED = sa.text("state = 'running' AND concurrency_key IS NOT NULL")


def upgrade() -> None:
    op.add_column("queues", sa.Column("retry", sa.JSON(), nullable=True))
    op.add_column("invocations", sa.Column("retry", sa.JSON(), nullable=True))
    op.add_column("invocations", sa.Column("concurrency_key", sa.String(length=256), nullable=True))
    op.create_index(
        "ix_invocations_running_key",
        "invocations",
        ["queue_id", "concurrency_key"],
        unique=False,
        sqlite_where=_RUNNING_KEYED,
        postgresql_where=_RUNNING_KEYED,
    )
    op.create_table(
        "rate_buckets",
        sa.Column("queue_id", sa.String(length=40), nullable=False),
        sa.Column("key", sa.String(length=256), nullable=False),
        sa.Column("tokens", sa.Float(), nullable=False),
        sa.Column("updated_at", lakeshore.store.types.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["queue_id"],
            ["queues.id"],
            name=op.f("fk_rate_buckets_queue_id_queues"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("queue_id", "key", name=op.f("pk_rate_buckets")),
    )


def downgrade() -> None:
    op.drop_table("rate_buckets")
    op.drop_index("ix_invocations_running_key", table_name="invocations")
    op.drop_column("invocations", "concurrency_key")  # SQLite drops a column in place
    op.drop_column("invocations", "retry")
    op.drop_column("queues", "retry")
