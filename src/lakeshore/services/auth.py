"""Who is calling: the admin, or a namespace (through a user's or a worker's token).

Every failure looks the same to the caller (401, "invalid or missing token") so a probe
learns nothing about which tokens exist. Wrong tokens are counted per client address
(:mod:`lakeshore.services.throttle`): past a burst, an address's wrong tokens are answered
429 with ``Retry-After``. A namespace or worker token from that address is still checked
and accepted: their secrets have 256 bits (no rate of guessing finds one), and one
address may be a NAT, a proxy or a host whose other daemons do nothing wrong. The admin
token, which an operator may have chosen, is accepted from a throttled address only if it
was accepted from it within :data:`ADMIN_SEEN_S`; otherwise it is answered as a wrong
token is, so the throttle bounds the guessing of a weak one.

A worker token (minted for one launched daemon, and handed to it through its environment,
its pod's Secret or its machine's user-data) opens the worker routes only: what a daemon
calls. Anything else with it is 403, so a token read off an instance cannot launch daemons,
write queues, submit or cancel work.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from cachetools import TTLCache

from lakeshore import files
from lakeshore.defaults import ADMIN_TOKEN_MIN_CHARS
from lakeshore.domain import access, tokens
from lakeshore.errors import Forbidden, InvalidInput, TooManyRequests, Unauthorized
from lakeshore.services import throttle
from lakeshore.store import namespaces as ns_store
from lakeshore.store.engine import Store

PrincipalKind = Literal["admin", "namespace", "worker"]
Client = tuple[str, int] | None  # the ASGI scope's client: (host, port), None if unknown

# a launched daemon's routes, and the wheel its machine installs before it says hello
WORKER_ROUTES = ("/v1/workers/", "/v1/dist")
WORKER_SCOPE = (
    "a worker token (minted for one launched daemon) may call only the worker routes "
    "(/v1/workers/…) and fetch the server's wheel (/v1/dist); use a namespace token for "
    "anything else"
)


@dataclass(frozen=True)
class Principal:
    kind: PrincipalKind
    namespace_id: str | None = None
    namespace: str | None = None
    token_id: str | None = None
    worker_id: str | None = None  # a worker token's one worker, once it said hello
    token_name: str | None = None  # the label it was created with (authPolicy names it)

    @property
    def is_admin(self) -> bool:
        return self.kind == "admin"

    def can_see(self, namespace: str) -> bool:
        return self.is_admin or self.namespace == namespace

    def require_access(self, raw_policy: Any, action: access.Action, queue: str) -> None:
        """Refuse (403, naming the rule) what the queue's ``authPolicy`` does not allow."""
        caller = access.Caller(self.is_admin, self.kind, self.token_id, self.token_name)
        refused = access.refusal(raw_policy, action, caller, queue)
        if refused is not None:
            raise Forbidden(refused)

    def require_admin(self, what: str) -> None:
        if not self.is_admin:
            raise Forbidden(f"only the admin token can {what}")

    def require_scope(self, route: str) -> None:
        """Refuse a worker token on any route but the worker routes (403)."""
        if self.kind == "worker" and not route.startswith(WORKER_ROUTES):
            raise Forbidden(WORKER_SCOPE)


ADMIN = Principal(kind="admin")


def principal_of(row: Mapping[Any, Any]) -> Principal:
    """The caller a live token's row (:func:`lakeshore.store.namespaces.get_token`) names."""
    return Principal(
        kind="worker" if row["kind"] == "worker" else "namespace",
        namespace_id=row["namespace_id"],
        namespace=row["namespace_name"],
        token_id=row["id"],
        worker_id=row["worker_id"],
        token_name=row["name"],
    )


async def authenticate(store: Store, admin_token: str, presented: str | None) -> Principal:
    """The caller a presented token names, read from the store (401 if it names none)."""
    return await Callers(store, admin_token, ttl_s=0).authenticate(presented)


CALLERS_TTL_S = 1.0  # a token revoked on any replica is refused within this long
CALLERS_MAX = 10_000  # tokens remembered at once, the least recently used dropped first
ADMIN_SEEN_S = 3600.0  # an address the admin token was accepted from, remembered this long
ADMIN_SEEN_REFRESH_S = 60.0  # (its time taken again at most this often)
INVALID = "invalid or missing token"
THROTTLED = "too many wrong tokens or sign-ins from this address: retry later"


def _utc_now() -> datetime:
    return datetime.now(UTC)


class Callers:
    """Who the presented tokens name, remembered for ``ttl_s`` so a busy daemon's requests
    do not each read its token: a revocation takes effect within ``ttl_s`` on every
    replica. Only a token's digest is kept (the entry is found by the token's id and the
    presented secret checked against it), and a worker token only once it is bound to its
    worker, so the hello that binds it is seen by the next request.

    A caller that says where a token comes from (``client``) has its wrong tokens counted
    by ``throttle`` on ``clock`` (see the module's docstring)."""

    def __init__(
        self,
        store: Store,
        admin_token: str,
        *,
        ttl_s: float = CALLERS_TTL_S,
        timer: Callable[[], float] = time.monotonic,
        clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        self.store, self.admin_token = store, admin_token
        self._known: TTLCache[str, tuple[str, Principal]] | None = (
            TTLCache(CALLERS_MAX, ttl_s, timer=timer) if ttl_s > 0 else None
        )
        self.clock, self._timer = clock, timer
        self.throttle = throttle.FailureThrottle()
        # address -> when (``timer``) the admin token was last accepted from it, in the
        # order they were (a plain dict: the admin's every request passes here)
        self._admin_seen: dict[str, float] = {}

    def forget(self, token_id: str) -> None:
        """Drop a token from this replica's memory (it was revoked here): refused from the
        next request on; other replicas refuse it within ``ttl_s``."""
        if self._known is not None:
            self._known.pop(token_id, None)

    def throttled(self, client: Client) -> bool:
        """Whether ``client``'s wrong tokens are answered 429 for now (its valid ones may
        still be accepted: ask :meth:`authenticate`)."""
        if client is None or not self.throttle.throttling():
            return False
        key = throttle.address_key(client[0])
        return self.throttle.wait(key, self.clock().timestamp()) is not None

    async def authenticate(self, presented: str | None, client: Client = None) -> Principal:
        """The caller ``presented`` names (401 if none); with ``client``, a wrong token
        is counted against its address, and answered 429 once it is throttled."""
        if not presented:
            raise Unauthorized("missing token: send Authorization: Bearer <token>")
        try:
            return await self._identify(presented, client)
        except Unauthorized:
            if client is None:
                raise
            key = throttle.address_key(client[0])
            waiting = self.throttle.failed(key, self.clock().timestamp())
            if waiting is None:
                raise
            raise TooManyRequests(THROTTLED, retry_after=waiting) from None

    async def _identify(self, presented: str, client: Client) -> Principal:
        if tokens.same_token(presented, self.admin_token):
            if client is not None:
                self._admit_admin(throttle.address_key(client[0]))
            return ADMIN
        parsed = tokens.parse(presented)
        if parsed is None:
            raise Unauthorized(INVALID)
        known = self._known.get(parsed.id) if self._known is not None else None
        if known is not None and tokens.matches(parsed.secret, known[0]):
            return known[1]
        async with self.store.read() as conn:
            row = await ns_store.get_token(conn, parsed.id)
        if row is None or not tokens.matches(parsed.secret, row["secret_hash"]):
            raise Unauthorized(INVALID)
        caller = principal_of(row)
        if self._known is not None and (caller.kind == "namespace" or caller.worker_id):
            self._known[parsed.id] = (row["secret_hash"], caller)
        return caller

    def _admit_admin(self, key: str) -> None:
        """The admin token from ``key``: refused as a wrong token is while the address is
        throttled, unless it was accepted from there within :data:`ADMIN_SEEN_S`."""
        now = self._timer()
        seen = self._admin_seen.get(key)
        if seen is not None and now - seen < ADMIN_SEEN_REFRESH_S:
            return
        if (
            (seen is None or now - seen > ADMIN_SEEN_S)
            and self.throttle.throttling()
            and self.throttle.wait(key, self.clock().timestamp()) is not None
        ):
            raise Unauthorized(INVALID)
        self._admin_seen.pop(key, None)  # to the end: the first is the least recent
        self._admin_seen[key] = now
        if len(self._admin_seen) > throttle.ADDRESSES_MAX:
            del self._admin_seen[next(iter(self._admin_seen))]


def load_or_create_admin_token(configured: str | None, path: Path) -> tuple[str, Path | None]:
    """The admin token: the configured one, else the one in ``path``, else a new one
    written there with mode 0600 (its folder, when this creates it, 0700). Returns the
    token and the file it lives in (if any). A token in the file shorter than
    ``ADMIN_TOKEN_MIN_CHARS`` is refused (``InvalidInput``), as the setting is."""
    if configured:
        return configured, None
    if path.exists():
        token = path.read_text().strip()
        if token and len(token) < ADMIN_TOKEN_MIN_CHARS:
            raise InvalidInput(
                f"the admin token in {path} is {len(token)} characters; an admin token "
                f"needs at least {ADMIN_TOKEN_MIN_CHARS}: delete the file (a new one is "
                "generated) or write a longer one",
                field="admin_token",
            )
        if token:
            return token, path
    files.private_dir(path.parent)
    token = tokens.mint().plaintext
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")
    os.replace(tmp, path)  # atomic: a concurrent reader never sees a half-written file
    return token, path
