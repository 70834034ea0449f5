"""the schedule and slot an invocation was made for

An invocation a periodic schedule submits carries the schedule's name and the slot it
stands for, shown on the invocation record (its ``kwargs`` stay the user's). Null for
every other invocation.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-07 13:15:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import lakeshore.store.types

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("invocations", sa.Column("schedule", sa.String(length=63), nullable=True))
    op.add_column(
        "invocations",
        sa.Column("slot", lakeshore.store.types.UTCDateTime(timezone=True), nullable=True),
    )


def downgrade() -> None:
    op.drop_column("invocations", "slot")  # SQLite drops a column in place since 3.35
    op.drop_column("invocations", "schedule")
