"""Statements run on psycopg's own connection, for the few hot ones that gain by it (a
pipeline inside a transaction; a statement of its own, prepared: :mod:`.statements`).

Each is written once, as a SQLAlchemy statement, and compiled here to the text psycopg
takes, so the statement has one home whichever way it runs.
"""

from __future__ import annotations

from typing import Any, cast

from psycopg import AsyncConnection as PsycopgConnection
from sqlalchemy.dialects.postgresql.psycopg import dialect as psycopg_dialect
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection


def psycopg_text(statement: Any) -> tuple[str, dict[str, Any]]:
    """``statement`` as psycopg runs it: its text (``%(name)s`` placeholders, fixed lists
    such as ``state IN (…)`` spelled out), and the values fixed in it; the caller adds
    the parameters it binds per call."""
    compiled = statement.compile(dialect=psycopg_dialect())  # type: ignore[no-untyped-call]
    unbound = {name for name, bind in compiled.binds.items() if bind.value is None}
    expanded = compiled.construct_expanded_state({name: "" for name in unbound})
    fixed = {k: v for k, v in expanded.parameters.items() if k not in unbound}
    return expanded.statement, fixed


async def psycopg_of(conn: AsyncConnection) -> PsycopgConnection[Any]:
    """The psycopg connection under ``conn`` (a PostgreSQL store's), in whatever
    transaction state ``conn`` left it."""
    return cast("PsycopgConnection[Any]", (await conn.get_raw_connection()).driver_connection)


def conninfo(url: URL) -> str:
    """``url`` (a PostgreSQL one, whatever its driver) as libpq takes it, for the
    connections psycopg opens outside SQLAlchemy's pool."""
    return url.set(drivername="postgresql").render_as_string(hide_password=False)
