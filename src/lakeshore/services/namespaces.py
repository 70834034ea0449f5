"""Namespaces and the tokens that open them."""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import RowMapping
from sqlalchemy.exc import IntegrityError

from lakeshore.domain import tokens
from lakeshore.domain.ids import new_id
from lakeshore.domain.names import NAME_RULE, is_valid_name
from lakeshore.errors import Conflict, InvalidInput, NotFound
from lakeshore.services.auth import Principal
from lakeshore.store import namespaces as ns_store
from lakeshore.store.engine import Store

DEFAULT_NAMESPACE = "default"


@dataclass(frozen=True)
class Namespace:
    id: str
    name: str
    created_at: datetime

    def to_json(self) -> dict[str, str]:
        return {"id": self.id, "name": self.name, "createdAt": self.created_at.isoformat()}


@dataclass(frozen=True)
class IssuedToken:
    id: str
    namespace: str
    name: str | None
    token: str
    created_at: datetime

    def to_json(self) -> dict[str, str | None]:
        return {
            "id": self.id,
            "namespace": self.namespace,
            "name": self.name,
            "token": self.token,
            "createdAt": self.created_at.isoformat(),
        }


async def resolve(
    store: Store,
    principal: Principal,
    name: str,
    known: MutableMapping[str, Namespace] | None = None,
) -> Namespace:
    """The namespace ``name`` as ``principal`` sees it: 404 if absent *or* not theirs.
    ``known`` remembers the namespaces found (a namespace's id and name never change)."""
    if principal.can_see(name) and is_valid_name(name):
        found = known.get(name) if known is not None else None
        if found is not None:
            return found
        async with store.read() as conn:
            row = await ns_store.get_by_name(conn, name)
        if row is not None:
            found = Namespace(id=row["id"], name=row["name"], created_at=row["created_at"])
            if known is not None:
                known[name] = found
            return found
    raise NotFound(f'namespace "{name}" not found', field="namespace")


async def create(store: Store, principal: Principal, name: str, now: datetime) -> Namespace:
    principal.require_admin("create namespaces")
    if not is_valid_name(name):
        raise InvalidInput(f"{name!r} is not a valid namespace name: use {NAME_RULE}", field="name")
    namespace = Namespace(id=new_id("ns"), name=name, created_at=now)
    try:
        async with store.write() as conn:
            if await ns_store.get_by_name(conn, name) is not None:
                raise Conflict(f'namespace "{name}" already exists', field="name")
            await ns_store.insert_namespace(conn, id=namespace.id, name=name, now=now)
    except IntegrityError as exc:  # a concurrent create won the race
        raise Conflict(f'namespace "{name}" already exists', field="name") from exc
    return namespace


async def ensure(store: Store, name: str, now: datetime) -> None:
    """Create ``name`` unless it exists (used at start for the default namespace)."""
    try:
        async with store.write() as conn:
            if await ns_store.get_by_name(conn, name) is None:
                await ns_store.insert_namespace(conn, id=new_id("ns"), name=name, now=now)
    except IntegrityError:
        pass  # another server created it first


async def list_visible(store: Store, principal: Principal) -> list[Namespace]:
    async with store.read() as conn:
        rows = await ns_store.list_all(conn)
    return [
        Namespace(id=r["id"], name=r["name"], created_at=r["created_at"])
        for r in rows
        if principal.can_see(r["name"])
    ]


def token_json(row: RowMapping, namespace: str) -> dict[str, Any]:
    """A token as listed: never its secret (shown once, at creation) nor its digest."""
    revoked = row["revoked_at"]
    return {
        "id": row["id"],
        "namespace": namespace,
        "name": row["name"],
        "createdAt": row["created_at"].isoformat(),
        "revokedAt": revoked.isoformat() if revoked is not None else None,
    }


async def list_tokens(store: Store, principal: Principal, namespace: str) -> list[dict[str, Any]]:
    principal.require_admin("list tokens")
    ns = await resolve(store, principal, namespace)
    async with store.read() as conn:
        rows = await ns_store.namespace_tokens(conn, ns.id)
    return [token_json(row, ns.name) for row in rows]


async def revoke_token(
    store: Store, principal: Principal, namespace: str, token_id: str, now: datetime
) -> dict[str, Any]:
    """Revoke a namespace token (admin); 404 for a token the namespace does not have."""
    principal.require_admin("revoke tokens")
    ns = await resolve(store, principal, namespace)
    row = None
    if len(token_id) <= 64:
        async with store.write() as conn:
            row = await ns_store.revoke_namespace_token(conn, ns.id, token_id, now)
    if row is None:
        raise NotFound(f'namespace "{ns.name}" has no token "{token_id}"', field="token")
    return token_json(row, ns.name)


async def issue_token(
    store: Store, principal: Principal, namespace: str, name: str | None, now: datetime
) -> IssuedToken:
    principal.require_admin("create tokens")
    if name is not None and (not 1 <= len(name) <= 128 or "\x00" in name):
        raise InvalidInput("a token name is 1-128 characters, without NUL", field="name")
    ns = await resolve(store, principal, namespace)
    minted = tokens.mint()
    async with store.write() as conn:
        await ns_store.insert_token(
            conn,
            id=minted.id,
            namespace_id=ns.id,
            kind="namespace",
            name=name,
            secret_hash=minted.secret_hash,
            now=now,
        )
    return IssuedToken(
        id=minted.id, namespace=ns.name, name=name, token=minted.plaintext, created_at=now
    )
