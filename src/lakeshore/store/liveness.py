"""Whether a pooled PostgreSQL connection may be used without a round trip first."""

from __future__ import annotations

import select
from typing import Any

# A pooled PostgreSQL connection idle longer than this is pinged (a round trip) before
# use; one used more recently is only looked at (no round trip: :func:`unsure`).
PING_IDLE_S = 10.0


def unsure(driver_connection: Any) -> bool:
    """Whether a pooled psycopg connection needs a ping before use, known without asking
    the server: it is closed or broken, or its socket is readable while it sat idle. A
    pooled connection LISTENs to nothing, so what arrives unasked is a server's last
    words: a terminated backend or a shutdown sends its error, then closes."""
    if driver_connection.closed or driver_connection.broken:
        return True
    poller = select.poll()  # not select(): a server with 1,024 descriptors open has more
    try:
        poller.register(driver_connection.pgconn.socket, select.POLLIN)
    except (OSError, ValueError):  # no socket any more
        return True
    return bool(poller.poll(0))
