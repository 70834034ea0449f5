"""worker names: a worker's id is its namespace's own (unique per namespace)

A worker row keeps a key of its own (``id``, what leases, launches and memberships point
at) and gets the id its namespace knows it by (``name``, what hello answers and the worker
routes take). They are the same but when a namespace picks an id another namespace already
uses: then the newcomer gets a fresh key, and neither namespace can tell.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03 16:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    for table in ("workers", "retired_workers"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column("name", sa.String(length=40), nullable=True))
        op.execute(f"UPDATE {table} SET name = id")
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.alter_column("name", existing_type=sa.String(length=40), nullable=False)
            batch_op.create_index(
                batch_op.f(f"ix_{table}_namespace_id_name"), ["namespace_id", "name"], unique=True
            )


def downgrade() -> None:
    for table in ("retired_workers", "workers"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_index(batch_op.f(f"ix_{table}_namespace_id_name"))
            batch_op.drop_column("name")
