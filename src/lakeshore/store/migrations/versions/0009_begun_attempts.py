"""which attempt a worker began running

A daemon with ``--prefetch`` holds leases on work waiting for a free slot as well as on
the work it runs. When the daemon dies, its unstarted work should go back to the queue
without costing an attempt, and only what had begun should be charged. A lease's expiry
alone cannot tell the two apart, so the heartbeat now says which of the leases it keeps
have begun, and the store keeps it: ``begun_attempt`` is the ``attempts`` value of the
attempt the worker began (null: not known to have begun). A number rather than a flag,
so that the next claim (which counts one more attempt) finds it stale without having to
clear it; what hands an attempt back uncounted clears it.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-08 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("invocations", sa.Column("begun_attempt", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("invocations", "begun_attempt")  # SQLite drops a column in place since 3.35
