"""One statement, prepared once per connection and run on libpq directly.

A single submit on PostgreSQL is one statement on one of the store's statement
connections (:mod:`.statements`). Through psycopg's cursor it cost the server ~95 us of
CPU, of which the statement's send and its answer's read, in libpq, were ~35: the rest
was the cursor's machinery (its adapters, its query conversion, the generators and
waits that drive an async connection). Here the statement is prepared on the
connection the first time it runs there, and each run is libpq's own calls on psycopg's
``pgconn`` (its public, low-level interface): the parameters sent as text, the socket
waited on with the event loop's reader, every result of the answer read, the rows as
text. ``bench/submit_app.py`` measured a single submit's CPU in the app at 228-298 us
against 282-340 through the cursor (docs/benchmarks.md).

Only a connection in autocommit that nothing else uses at the time may run one (those
of :class:`.statements.StatementConnections`). A run cancelled while it waits leaves the
connection busy: :class:`.statements.StatementConnections` then closes it rather than
hand it on; it first has the server cancel the statement.
"""

from __future__ import annotations

import asyncio
import re
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection, errors, pq

_PLACEHOLDER = re.compile(r"%\((\w+)\)s")
# the statement is not as the server prepared it, and did not run: prepared again. 26000:
# the server no longer knows it (its connection was reset); 0A000: "cached plan must not
# change result type" (a table it reads changed)
_PREPARE_AGAIN = frozenset({"26000", "0A000"})
_NAMES: dict[bytes, bytes] = {}  # each statement's name, and the text it stands for


@dataclass(frozen=True)
class Prepared:
    """A statement's name on the connection, its text (``$n`` placeholders) and the
    names of its parameters, in their order."""

    name: bytes
    sql: bytes
    parameters: tuple[str, ...]

    @classmethod
    def of(cls, name: str, psycopg_sql: str) -> Prepared:
        """From psycopg's text of it (``%(name)s`` placeholders, as
        :func:`lakeshore.store.driver.psycopg_text` gives it)."""
        names: list[str] = []

        def numbered(match: re.Match[str]) -> str:
            if match.group(1) not in names:
                names.append(match.group(1))
            return f"${names.index(match.group(1)) + 1}"

        sql = _PLACEHOLDER.sub(numbered, psycopg_sql).replace("%%", "%").encode()
        key = f"lakeshore_{name}".encode()
        if _NAMES.setdefault(key, sql) != sql:
            raise ValueError(f"a prepared statement named {name!r} stands for another text")
        return cls(key, sql, tuple(names))


# the statements each connection has prepared (forgotten with the connection)
_PREPARED: weakref.WeakKeyDictionary[AsyncConnection[Any], set[bytes]] = weakref.WeakKeyDictionary()


async def fetch(
    conn: AsyncConnection[Any], statement: Prepared, parameters: Mapping[str, Any]
) -> list[tuple[str | None, ...]]:
    """Run ``statement`` with ``parameters`` (each by its name) on ``conn``: the rows it
    returned, each column as text (``None`` for NULL). The server's error, raised by
    the statement or at its commit, is raised as psycopg's; a lost connection as
    psycopg's ``OperationalError``."""
    encoding = conn.info.encoding
    values = [_text(parameters[name], encoding) for name in statement.parameters]
    known = _PREPARED.setdefault(conn, set())
    if statement.name not in known:
        await _prepare(conn, statement)
        known.add(statement.name)
    try:
        result = await _run(conn, statement.name, values)
    except errors.Error as exc:
        if exc.sqlstate not in _PREPARE_AGAIN:
            raise
        await _answer(conn, conn.pgconn.send_close_prepared, statement.name)
        await _prepare(conn, statement)
        result = await _run(conn, statement.name, values)
    return [
        tuple(
            None if (value := result.get_value(row, column)) is None else value.decode(encoding)
            for column in range(result.nfields)
        )
        for row in range(result.ntuples)
    ]


async def _prepare(conn: AsyncConnection[Any], statement: Prepared) -> None:
    await _answer(conn, conn.pgconn.send_prepare, statement.name, statement.sql)


async def _run(conn: AsyncConnection[Any], name: bytes, values: Sequence[bytes | None]) -> Any:
    return await _answer(conn, conn.pgconn.send_query_prepared, name, values)


async def _answer(conn: AsyncConnection[Any], send: Any, *arguments: Any) -> Any:
    """Send, flush, and read the whole answer: its first result. Every result is read,
    to the end of the answer: in autocommit an error at the commit (a deferred
    constraint, a full NOTIFY queue, a serialization failure) comes as a result after
    the statement's own. The first error among them is raised; a result of a kind no
    statement here gives, as ``OperationalError``."""
    pgconn = conn.pgconn
    loop = asyncio.get_running_loop()
    fd = pgconn.socket
    send(*arguments)
    while pgconn.flush():  # the kernel's buffer was full: the rest when it drains
        await _ready(loop.add_writer, loop.remove_writer, fd)
    results = []
    while True:
        pgconn.consume_input()
        while pgconn.is_busy():  # get_result() would block the loop: wait for the rest
            await _ready(loop.add_reader, loop.remove_reader, fd)
            pgconn.consume_input()
        result = pgconn.get_result()
        if result is None:
            break
        results.append(result)
        if result.status in _COPY:  # libpq would hand these on forever
            break
    for result in results:
        if result.status == pq.ExecStatus.FATAL_ERROR:
            raise errors.error_from_result(result, conn.info.encoding)
    if not results or any(r.status not in _ANSWERS for r in results):
        statuses = ", ".join(pq.ExecStatus(r.status).name for r in results) or "none"
        raise errors.OperationalError(f"unexpected answer from the server: {statuses}")
    return results[0]


_ANSWERS = frozenset({pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK})
_COPY = frozenset({pq.ExecStatus.COPY_IN, pq.ExecStatus.COPY_OUT, pq.ExecStatus.COPY_BOTH})


async def _ready(watch: Any, unwatch: Any, fd: int) -> None:
    waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    watch(fd, _wake, waiter)
    try:
        await waiter
    finally:
        unwatch(fd)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _text(value: Any, encoding: str = "utf-8") -> bytes | None:
    """A parameter as PostgreSQL reads it in text format (its type is the statement's:
    a column's or a cast's)."""
    if value is None:
        return None
    if isinstance(value, str):
        if "\x00" in value:  # libpq would end the text there
            raise errors.DataError("a text parameter holds a NUL character")
        return value.encode(encoding)
    if isinstance(value, bool):
        return b"t" if value else b"f"
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("a time sent to the store carries its time zone")
        return value.isoformat().encode()
    if isinstance(value, int):
        return str(int(value)).encode()
    if isinstance(value, float):
        return repr(float(value)).encode()
    raise TypeError(f"no text form for a {type(value).__name__} parameter")
