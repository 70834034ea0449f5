"""Alembic environment: migrations run on a synchronous connection handed in by
:func:`lakeshore.store.engine.migrate`, or on ``sqlalchemy.url`` from the CLI."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from lakeshore.store.tables import metadata

config = context.config


def run() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = create_engine(config.get_main_option("sqlalchemy.url") or "", poolclass=pool.NullPool)
    with engine.connect() as conn:
        context.configure(connection=conn, target_metadata=metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()


run()
