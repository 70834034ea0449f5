"""a queue's pending invocations by concurrency key, for a claim's fair turns

A claim of a queue whose pending rows carry a ``concurrency_key`` takes them in turns
between the keys (the first of each key, then the second …). It finds the keys one
index probe each and each key's first rows in submit order from
``ix_invocations_pending_key``; rows without a key are not indexed, so a submit to a
queue without keys writes no entry.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07 21:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_PENDING_KEYED = sa.text("state = 'pending' AND concurrency_key IS NOT NULL")


def upgrade() -> None:
    op.create_index(
        "ix_invocations_pending_key",
        "invocations",
        ["queue_id", "concurrency_key", "created_at", "id"],
        unique=False,
        sqlite_where=_PENDING_KEYED,
        postgresql_where=_PENDING_KEYED,
    )


def downgrade() -> None:
    op.drop_index("ix_invocations_pending_key", table_name="invocations")
