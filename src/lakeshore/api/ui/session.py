"""The dashboard's session cookie and its CSRF protection.

A signed-in browser holds one cookie: an opaque session id, HttpOnly, SameSite=Strict,
scoped to ``/ui``, kept :data:`MAX_AGE_S`. The session itself is in the store
(:mod:`lakeshore.services.sessions`), shared by every replica: each request reads it, so
signing out (on any replica), revoking its token, its expiry or a new admin token ends
it from the next request on. The cookie holds no token in any form.

Every state-changing request (``POST``) carries a CSRF token in the form field ``csrf``
or the ``X-CSRF-Token`` header: a MAC of the session cookie (before sign-in, of a random
cookie set with the sign-in form), compared in constant time. A request whose ``Origin``
names another site is refused too.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import datetime

from fastapi import Request, Response

from lakeshore.errors import Forbidden
from lakeshore.services import sessions
from lakeshore.services.auth import Principal
from lakeshore.store.engine import Store

SESSION_COOKIE = "lakeshore_session"
LOGIN_COOKIE = "lakeshore_login"  # the random value the sign-in form's CSRF token is of
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"
MAX_AGE_S = sessions.MAX_AGE_S
PATH = "/ui"
_LONGEST_ID = 64  # a session id is 43 characters; a longer cookie is none of ours


class Sessions:
    """The sessions of one server: the key their ids are hashed with and the key of the
    CSRF tokens, both derived from the admin token (shared by every replica)."""

    def __init__(self, admin_token: str) -> None:
        self._key = sessions.session_key(admin_token)
        self._csrf_key = hashlib.sha256(b"lakeshore dashboard csrf\0" + self._key).digest()

    async def begin(
        self, request: Request, store: Store, principal: Principal, now: datetime
    ) -> str:
        """A new session for ``principal`` (ending the one the browser held): its id."""
        return await sessions.begin(
            store, self._key, principal, now, replacing=_session_id(request)
        )

    async def principal(self, request: Request, store: Store, now: datetime) -> Principal | None:
        """Who the request's session is, or None (no session, or one that has ended)."""
        session_id = _session_id(request)
        if session_id is None:
            return None
        return await sessions.resume(store, self._key, session_id, now)

    async def end(self, request: Request, store: Store) -> None:
        """Sign out: the request's session ends, here and on every replica."""
        session_id = _session_id(request)
        if session_id is not None:
            await sessions.end(store, self._key, session_id)

    def csrf_for(self, value: str) -> str:
        return hmac.new(self._csrf_key, value.encode(), hashlib.sha256).hexdigest()

    def csrf(self, request: Request) -> str:
        """The CSRF token pages of this session put in their forms."""
        return self.csrf_for(request.cookies.get(SESSION_COOKIE, ""))

    def check(self, request: Request, presented: str | None, *, cookie: str) -> None:
        """Refuse (403) a state-changing request without the right CSRF token."""
        origin = request.headers.get("origin")
        if origin and origin != _own_origin(request):
            raise Forbidden("cross-site request refused")
        value = request.cookies.get(cookie, "")
        expected = self.csrf_for(value)
        if not value or not presented or not hmac.compare_digest(presented, expected):
            raise Forbidden("missing or wrong CSRF token: reload the page and try again")


def _session_id(request: Request) -> str | None:
    value = request.cookies.get(SESSION_COOKIE)
    return value if value and len(value) <= _LONGEST_ID else None


def _own_origin(request: Request) -> str:
    return f"{request.url.scheme}://{request.headers.get('host', request.url.netloc)}"


def new_login_value() -> str:
    return secrets.token_urlsafe(24)


def set_cookie(response: Response, request: Request, name: str, value: str, max_age: int) -> None:
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path=PATH,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def clear_cookie(response: Response, name: str) -> None:
    response.delete_cookie(name, path=PATH, httponly=True, samesite="strict")
