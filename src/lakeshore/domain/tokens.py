"""API tokens: their shape, and how they are checked without storing them.

A token reads ``lks_<id>_<secret>``. The id finds the row; only a SHA-256 digest of the
secret is stored (the secret has 256 bits of entropy, so a slow hash would add nothing),
and digests are compared in constant time. A token leaked from a log can be matched to
its row by id and revoked without the secret ever having been on disk.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Final

PREFIX: Final = "lks_"
_ID_BYTES: Final = 8
_SECRET_BYTES: Final = 32


@dataclass(frozen=True)
class NewToken:
    id: str
    secret_hash: str
    plaintext: str


@dataclass(frozen=True)
class ParsedToken:
    id: str
    secret: str


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def mint() -> NewToken:
    """A fresh token; ``plaintext`` is shown once and never stored."""
    token_id = secrets.token_hex(_ID_BYTES)
    secret = secrets.token_urlsafe(_SECRET_BYTES)
    return NewToken(
        id=token_id, secret_hash=digest(secret), plaintext=f"{PREFIX}{token_id}_{secret}"
    )


def parse(token: str) -> ParsedToken | None:
    """Split a presented token into id and secret; ``None`` if it is not one of ours."""
    if not token.startswith(PREFIX):
        return None
    token_id, sep, secret = token[len(PREFIX) :].partition("_")
    if not sep or not secret or len(token_id) != _ID_BYTES * 2:
        return None
    return ParsedToken(id=token_id, secret=secret)


def matches(secret: str, secret_hash: str) -> bool:
    """Constant-time check of a presented secret against a stored digest."""
    return hmac.compare_digest(digest(secret), secret_hash)


def same_token(presented: str, expected: str) -> bool:
    """Constant-time comparison of two whole tokens (the admin token is not in the store)."""
    return hmac.compare_digest(digest(presented), digest(expected))
