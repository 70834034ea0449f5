"""the dashboard's sessions, kept server-side

A signed-in browser held the token it signed in with, signed, in its cookie: signing out
only asked the browser to forget it, so a copy taken before still opened the dashboard
for its 12 hours, and the token cut out of it opened the API. The cookie now holds a
random session id; the store keeps a keyed hash of it with the token it stands for (null
for the admin token) and when it ends. Every replica reads the same rows, so signing out
on one ends the session on all; a revoked token's sessions end with it.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-08 12:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import lakeshore.store.types

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "ui_sessions",
        sa.Column("id_hash", sa.String(length=64), nullable=False),
        sa.Column("token_id", sa.String(length=40), nullable=True),
        sa.Column("created_at", lakeshore.store.types.UTCDateTime(timezone=True), nullable=False),
        sa.Column("expires_at", lakeshore.store.types.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["token_id"],
            ["tokens.id"],
            name=op.f("fk_ui_sessions_token_id_tokens"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id_hash", name=op.f("pk_ui_sessions")),
    )
    op.create_index(op.f("ix_ui_sessions_expires_at"), "ui_sessions", ["expires_at"])
    op.create_index(op.f("ix_ui_sessions_token_id"), "ui_sessions", ["token_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_ui_sessions_token_id"), table_name="ui_sessions")
    op.drop_index(op.f("ix_ui_sessions_expires_at"), table_name="ui_sessions")
    op.drop_table("ui_sessions")
