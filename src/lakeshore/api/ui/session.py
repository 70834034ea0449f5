"""The dashboard's session and its CSRF protection.

A signed-in browser holds one cookie: the token it signed in with, signed and stamped by
the server (``itsdangerous``), HttpOnly, SameSite=Strict, scoped to ``/ui``. Every request
checks the token again as a bearer token would be checked (a revoked token is refused
within a second), and a session older than :data:`MAX_AGE_S` is refused. The signing key
is derived from the admin token, so every replica that shares it accepts the cookie and
changing the admin token ends every session.

Every state-changing request (``POST``) carries a CSRF token in the form field ``csrf``
or the ``X-CSRF-Token`` header: a MAC of the session cookie (before sign-in, of a random
cookie set with the sign-in form), compared in constant time. A request whose ``Origin``
names another site is refused too.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from fastapi import Request, Response
from itsdangerous import BadSignature, SignatureExpired, TimestampSigner

from lakeshore.errors import Forbidden

SESSION_COOKIE = "lakeshore_session"
LOGIN_COOKIE = "lakeshore_login"  # the random value the sign-in form's CSRF token is of
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"
MAX_AGE_S = 12 * 3600
PATH = "/ui"


class Sessions:
    def __init__(self, admin_token: str) -> None:
        key = hashlib.sha256(b"lakeshore dashboard session\0" + admin_token.encode()).digest()
        self._signer = TimestampSigner(key, salt="lakeshore.ui.session")
        self._csrf_key = hashlib.sha256(b"lakeshore dashboard csrf\0" + key).digest()

    def seal(self, token: str) -> str:
        return self._signer.sign(token.encode()).decode()

    def token(self, request: Request) -> str | None:
        """The token of the request's session, or None (none, forged, or expired)."""
        sealed = request.cookies.get(SESSION_COOKIE)
        if not sealed:
            return None
        try:
            return self._signer.unsign(sealed, max_age=MAX_AGE_S).decode()
        except (BadSignature, SignatureExpired, UnicodeDecodeError):
            return None

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
