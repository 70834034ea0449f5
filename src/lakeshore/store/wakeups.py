"""Wake-ups across server replicas: PostgreSQL ``NOTIFY`` out, ``LISTEN`` in.

A write that makes something newly available (a submit to a queue, a stream item, an
invocation ending) publishes its keys inside its own transaction, so PostgreSQL delivers
them only if it commits. Every replica's listener hands the keys to its in-process
notifier, which wakes the claims and stream followers waiting on them. SQLite is one
server's embedded store: publishing is a no-op there and the in-process notifier is all.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any

import psycopg
import psycopg.conninfo
from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.types import Text

from lakeshore.store.driver import conninfo

log = logging.getLogger("lakeshore.wakeups")

CHANNEL = "lakeshore_wakeup"
SEPARATOR = " "  # between the keys of one notification (keys are ids: no spaces)
PAYLOAD_BYTES = 7900  # PostgreSQL takes notification payloads of under 8000 bytes
# A listener only ever reads: a server gone silent (no FIN, no RST: a dropped route, a
# host that froze) would leave it waiting for ever, deaf to every other replica. TCP
# keepalives find such a connection dead within about a minute (30 s idle, then 3 probes
# 10 s apart), and it reconnects. Where the database's URL sets its own, those stand.
KEEPALIVES = {
    "keepalives": "1",
    "keepalives_idle": "30",
    "keepalives_interval": "10",
    "keepalives_count": "3",
}
_PUBLISH = text("SELECT pg_notify(:channel, payload) FROM unnest(:payloads) AS payload").bindparams(
    bindparam("payloads", type_=ARRAY(Text()))
)


def payloads(keys: Iterable[str]) -> list[str]:
    """``keys`` packed into as few notification payloads as fit: a batch of 250
    outcomes is one notification to every replica, not 250."""
    packed: list[str] = []
    current: list[str] = []
    size = 0
    for key in sorted(set(keys)):
        width = len(key.encode()) + 1
        if current and size + width > PAYLOAD_BYTES:
            packed.append(SEPARATOR.join(current))
            current, size = [], 0
        current.append(key)
        size += width
    if current:
        packed.append(SEPARATOR.join(current))
    return packed


async def publish(conn: AsyncConnection, keys: Iterable[str]) -> None:
    """Announce ``keys`` to every replica when the current transaction commits."""
    if conn.dialect.name == "postgresql" and (packed := payloads(keys)):
        await conn.execute(_PUBLISH, {"channel": CHANNEL, "payloads": packed})


def listener_conninfo(url: URL) -> str:
    """The listener's connection: ``url``'s, with :data:`KEEPALIVES` where it sets none."""
    base = conninfo(url)
    given = psycopg.conninfo.conninfo_to_dict(base)
    extra = {name: value for name, value in KEEPALIVES.items() if name not in given}
    return psycopg.conninfo.make_conninfo(base, **extra)


async def listen(
    url: URL,
    deliver: Callable[[list[str]], None],
    deliver_all: Callable[[], None],
    *,
    retry_s: float = 1.0,
    connected: asyncio.Event | None = None,
) -> None:
    """Feed every key published on ``url`` to ``deliver``, until cancelled.

    The connection is re-made when it drops; after each (re)connect everyone waiting is
    woken once (``deliver_all``), since keys published meanwhile were not heard.
    """
    while True:
        try:
            async with await psycopg.AsyncConnection.connect(
                listener_conninfo(url), autocommit=True
            ) as conn:
                await conn.execute(f"LISTEN {CHANNEL}")
                deliver_all()
                if connected is not None:
                    connected.set()
                await _heard(conn, deliver)
        except (psycopg.Error, OSError) as exc:
            log.warning("wake-up listener lost its connection (%s); reconnecting", exc)
        if connected is not None:
            connected.clear()
        await asyncio.sleep(retry_s)


async def _heard(conn: psycopg.AsyncConnection[Any], deliver: Callable[[list[str]], None]) -> None:
    """Each notification's keys to ``deliver``, read as the connection's socket turns
    readable, until the connection fails (its error is raised).

    One reader stays on the socket for the connection's life. psycopg's ``notifies()``
    takes the connection's lock and sets up a reader and a future for every wait: 40-60
    us of CPU a notification heard on the bench machine, against 20-30 this way
    (``bench/listener.py``); a single submit is heard once by every replica.
    """
    loop = asyncio.get_running_loop()
    pgconn, encoding = conn.pgconn, conn.info.encoding
    lost: asyncio.Future[None] = loop.create_future()
    fd = pgconn.socket
    watching = [fd]

    def unwatch() -> None:
        if watching:
            loop.remove_reader(watching.pop())

    def readable() -> None:
        try:
            pgconn.consume_input()  # raises when the connection is gone
            while (notice := pgconn.notifies()) is not None:
                deliver(notice.extra.decode(encoding).split(SEPARATOR))
        except Exception as exc:  # raised by the await below
            # at once: libpq has closed the socket, and the next one opened in this
            # process may get its number, and a reader of its own to keep
            unwatch()
            if not lost.done():
                lost.set_exception(exc)

    loop.add_reader(fd, readable)
    try:
        readable()  # any that came with LISTEN's answer
        await lost
    finally:
        unwatch()
