"""Provider registrations: register, list, read and remove them, and read their launches.

A registration is ``{name, kind, config}`` in one namespace. Its config is validated by its
kind's model (:func:`lakeshore.providers.parse_config`) and stored as that model dumps it,
defaults filled in. Kinds that run code on the server's own machine (``Kind.admin_only``)
can be registered by the admin token only. A provider a queue still launches through
cannot be removed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, StrictStr, ValidationError
from sqlalchemy import RowMapping
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from lakeshore.domain import cursors, jsonsafe
from lakeshore.domain.ids import new_id
from lakeshore.domain.names import Name, is_valid_name
from lakeshore.domain.validation import invalid_input
from lakeshore.errors import Conflict, Forbidden, InvalidInput, NotFound
from lakeshore.providers import KINDS, parse_config
from lakeshore.providers.base import missing_extra
from lakeshore.services.auth import Principal
from lakeshore.services.namespaces import Namespace
from lakeshore.store import launches as launch_store
from lakeshore.store import providers as provider_store
from lakeshore.store.engine import Store

DEFAULT_PAGE: Final = 100
MAX_PAGE: Final = 1000


class ProviderBody(BaseModel):
    """What ``POST …/providers`` takes (the config is checked against its kind after)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: Name
    kind: StrictStr
    config: dict[str, Any] | None = None


@dataclass(frozen=True)
class Registration:
    """A stored provider registration."""

    id: str
    namespace_id: str
    name: str
    kind: str
    config: dict[str, Any]
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: RowMapping) -> Registration:
        return cls(
            id=row["id"],
            namespace_id=row["namespace_id"],
            name=row["name"],
            kind=row["kind"],
            config=dict(row["config"] or {}),
            created_at=row["created_at"],
            updated_at=row["updated_at"],
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "config": self.config,
            "createdAt": self.created_at.isoformat(),
            "updatedAt": self.updated_at.isoformat(),
        }


def _not_found(name: str) -> NotFound:
    return NotFound(f'provider "{name}" not found', field="name")


def _taken(name: str) -> Conflict:
    return Conflict(f'provider "{name}" already exists in this namespace', field="name")


def _parse(body: Any) -> tuple[str, str, dict[str, Any]]:
    """The name, kind and raw config of a registration body (422 naming the field)."""
    if not isinstance(body, dict):
        raise InvalidInput("a provider is a JSON object: {name, kind, config}")
    if "config" in body and not isinstance(body["config"], dict | None):
        raise InvalidInput("config is a JSON object", field="config")
    try:
        parsed = ProviderBody.model_validate(body)
    except ValidationError as exc:
        raise invalid_input(exc) from exc
    return parsed.name, parsed.kind, parsed.config or {}


def _check_kind(caller: Principal, kind: str) -> None:
    spec = KINDS.get(kind)
    if spec is not None and spec.admin_only and not caller.is_admin:
        raise Forbidden(
            f'provider kind "{kind}" runs code on the server\'s own machine or with its own '
            "cloud credentials: only the admin token can register one"
        )
    missing = missing_extra(kind)
    if missing:
        raise InvalidInput(missing, field="kind")


async def _load(conn: AsyncConnection, ns: Namespace, name: str) -> RowMapping:
    row = await provider_store.get(conn, ns.id, name) if is_valid_name(name) else None
    if row is None:
        raise _not_found(name)
    return row


async def create(
    store: Store, caller: Principal, ns: Namespace, body: Any, now: datetime
) -> Registration:
    name, kind, raw = _parse(body)
    if kind not in KINDS:
        parse_config(kind, raw)  # raises the 422 that lists the kinds
    _check_kind(caller, kind)
    config = parse_config(kind, raw).model_dump(mode="json", exclude_none=True)
    jsonsafe.require_storable(config, "config")
    try:
        async with store.write() as conn:
            if await provider_store.get(conn, ns.id, name) is not None:
                raise _taken(name)
            row = await provider_store.insert(
                conn,
                id=new_id("prov"),
                namespace_id=ns.id,
                name=name,
                kind=kind,
                config=config,
                now=now,
            )
    except IntegrityError as exc:  # a concurrent create won the race
        raise _taken(name) from exc
    return Registration.from_row(row)


async def list_(store: Store, ns: Namespace) -> list[Registration]:
    async with store.read() as conn:
        rows = await provider_store.list(conn, ns.id)
    return [Registration.from_row(row) for row in rows]


async def get(store: Store, ns: Namespace, name: str) -> Registration:
    async with store.read() as conn:
        return Registration.from_row(await _load(conn, ns, name))


async def delete(store: Store, ns: Namespace, name: str) -> Registration:
    """Remove a registration (409 while a queue launches through it); returns what it was."""
    async with store.write() as conn:
        registration = Registration.from_row(await _load(conn, ns, name))
        users = await provider_store.queues_naming(conn, ns.id, name)
        if users:
            listed = ", ".join(f'"{queue}"' for queue in users)
            plural = "s" if len(users) != 1 else ""
            raise Conflict(
                f'provider "{name}" is still named by queue{plural} {listed} (providerRef or '
                "daemonTemplate.provider); point them at another provider first",
                field="name",
            )
        if not await provider_store.delete(conn, ns.id, name):
            raise _not_found(name)
    return registration


def launch_json(row: RowMapping) -> dict[str, Any]:
    def iso(value: datetime | None) -> str | None:
        return value.isoformat() if value else None

    return {
        "id": row["id"],
        "scope": row["scope"],
        "state": row["state"],
        "provider": row["provider_name"],
        "handle": row["handle"],
        "error": row["error"],
        "worker": row["worker_id"],
        "body": row["body"],
        "created_at": iso(row["created_at"]),
        "expires_at": iso(row["expires_at"]),
        "resolved_at": iso(row["resolved_at"]),
        "terminated_at": iso(row["terminated_at"]),
        "terminate_error": row["terminate_error"],
    }


async def launches(
    store: Store, ns: Namespace, name: str, limit: int, cursor: str | None
) -> dict[str, Any]:
    """A provider's launches, newest first, ``limit`` a page; ``next_cursor`` continues."""
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidInput(f"limit is 1-{MAX_PAGE}", field="limit")
    before = cursors.parse(cursor)
    async with store.read() as conn:
        await _load(conn, ns, name)
        rows = await launch_store.list_for_provider(conn, ns.id, name, limit=limit, before=before)
    next_cursor = None
    if len(rows) == limit:
        last = rows[-1]
        next_cursor = cursors.issue(last["created_at"], last["id"])
    return {"launches": [launch_json(row) for row in rows], "next_cursor": next_cursor}
