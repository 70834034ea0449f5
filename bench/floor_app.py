"""The least an HTTP submit can be: an ASGI app with no framework, for bench/submit_floor.py.

``FLOOR_MODE=noop`` answers every request with a fixed id; ``FLOOR_MODE=insert`` first
writes the request's JSON body as one row, one autocommit ``INSERT`` (prepared) on one
psycopg connection to ``FLOOR_DATABASE_URL``. No token, no validation, no queue: what
Lakeshore's single submit does beyond this is its own cost.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import psycopg

MODE = os.environ.get("FLOOR_MODE", "noop")
_conn: psycopg.AsyncConnection[Any] | None = None
_INSERT = "INSERT INTO floor_submits (id, body) VALUES (%s, %s)"


async def _lifespan(receive: Any, send: Any) -> None:
    global _conn
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            if MODE == "insert":
                _conn = await psycopg.AsyncConnection.connect(
                    os.environ["FLOOR_DATABASE_URL"], autocommit=True
                )
                await _conn.execute(
                    "CREATE TABLE IF NOT EXISTS floor_submits (id text PRIMARY KEY,"
                    " body jsonb NOT NULL, created_at timestamptz DEFAULT now())"
                )
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            if _conn is not None:
                await _conn.close()
            await send({"type": "lifespan.shutdown.complete"})
            return


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body", False):
            break
    ident = uuid.uuid4().hex
    if _conn is not None:
        await _conn.execute(_INSERT, (ident, body.decode()), prepare=True)
    answer = b'{"id":"%s","state":"pending"}' % ident.encode()
    await send(
        {
            "type": "http.response.start",
            "status": 201,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": answer})
