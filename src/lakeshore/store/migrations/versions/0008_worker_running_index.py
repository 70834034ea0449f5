"""a worker's running invocations, found without its history

Finished invocations keep their ``worker_id`` (an answer names the worker that ran it),
and nothing removes them. Every question asked on the hot path of one worker is about
what it runs now (``worker_id = ? AND state = 'running'``): a claim's view of what the
worker holds, the count of a submit handed to a waiting claim, a heartbeat's leases.
``ix_invocations_worker_id`` held ``worker_id`` alone, so each of them walked every row
the worker had ever run and read each from the table to look at its state: a daemon
that had run 100,000 invocations made each claim and each handed submit read 100,000
rows. The index now holds ``(worker_id, state)``: the same rows (those with a worker),
and the running ones of a worker are a range of it, found as they are however long the
worker has been working. Both stores take that range whether the state is written into
the query or bound as a parameter (a partial index over running rows would serve only
the queries that write it). The new index is made before the old one goes, so that no
moment of the migration is without one.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-07 06:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_HAS_WORKER = sa.text("worker_id IS NOT NULL")


def upgrade() -> None:
    op.create_index(
        "ix_invocations_worker_state",
        "invocations",
        ["worker_id", "state"],
        unique=False,
        sqlite_where=_HAS_WORKER,
        postgresql_where=_HAS_WORKER,
    )
    op.drop_index("ix_invocations_worker_id", table_name="invocations")


def downgrade() -> None:
    op.create_index(
        "ix_invocations_worker_id",
        "invocations",
        ["worker_id"],
        unique=False,
        sqlite_where=_HAS_WORKER,
        postgresql_where=_HAS_WORKER,
    )
    op.drop_index("ix_invocations_worker_state", table_name="invocations")
