"""The dashboard's sessions, kept in the store so that every replica shares them.

A sign-in makes a random session id (256 bits), which the browser's cookie holds and
nothing else does: the store keeps an HMAC of it, keyed by a key derived from the admin
token, with the token the session stands for (none for the admin token) and when it
ends, :data:`MAX_AGE_S` after the sign-in. Each request of the session reads its row
(one lookup by primary key, joined to its token): a session ends when it is signed out
(its row deleted, on any replica), when its token is revoked (the join finds no live
token; the revocation also deletes the rows), when it expires, and when the admin token
changes (every hash changes with the key). Neither the token nor anything it could be
derived from is in the cookie; a copy of the store's rows opens nothing without the ids.

Expired rows are deleted as sessions are made, :data:`SWEEP_BATCH` at a time, so the
table holds about the sessions of the last :data:`MAX_AGE_S` and a sign-in's cost stays
bounded whatever piled up.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import datetime, timedelta

from lakeshore.services import auth
from lakeshore.services.auth import Principal
from lakeshore.store import ui_sessions as session_store
from lakeshore.store.engine import Store

MAX_AGE_S = 12 * 3600
SWEEP_BATCH = 100  # expired sessions deleted with each new one


def session_key(admin_token: str) -> bytes:
    """The key of the session ids' hashes: every replica sharing the admin token has it."""
    return hashlib.sha256(b"lakeshore dashboard session id\0" + admin_token.encode()).digest()


def id_hash(key: bytes, session_id: str) -> str:
    return hmac.new(key, session_id.encode(), hashlib.sha256).hexdigest()


async def begin(
    store: Store,
    key: bytes,
    principal: Principal,
    now: datetime,
    *,
    replacing: str | None = None,
) -> str:
    """A new session of ``principal`` (the admin, or a namespace token's caller): its id,
    for the cookie. The session the browser held (``replacing``) ends, and up to
    :data:`SWEEP_BATCH` expired ones are deleted with it."""
    session_id = secrets.token_urlsafe(32)
    async with store.write() as conn:
        if replacing:
            await session_store.delete_session(conn, id_hash(key, replacing))
        await session_store.delete_expired(conn, now, SWEEP_BATCH)
        await session_store.insert_session(
            conn,
            id_hash=id_hash(key, session_id),
            token_id=None if principal.is_admin else principal.token_id,
            now=now,
            expires_at=now + timedelta(seconds=MAX_AGE_S),
        )
    return session_id


async def resume(store: Store, key: bytes, session_id: str, now: datetime) -> Principal | None:
    """Who a live session is, or None: no such session, signed out, expired, or its
    token revoked."""
    async with store.read() as conn:
        row = await session_store.get_live(conn, id_hash(key, session_id), now)
    if row is None:
        return None
    return auth.ADMIN if row["id"] is None else auth.principal_of(row)


async def end(store: Store, key: bytes, session_id: str) -> None:
    """Sign out: the session ends on every replica from the next request on."""
    async with store.write() as conn:
        await session_store.delete_session(conn, id_hash(key, session_id))
