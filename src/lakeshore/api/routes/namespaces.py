"""Namespaces and their tokens (creating either, listing or revoking tokens takes the
admin token)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from lakeshore.api.deps import Caller, State
from lakeshore.services import namespaces as ns_service

router = APIRouter(prefix="/v1/namespaces", tags=["namespaces"])


class NamespaceIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: str = Field(max_length=256)


class TokenIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: str | None = Field(default=None, max_length=256, description="A label for the token")


@router.get("", summary="List the namespaces the caller can see")
async def list_namespaces(state: State, caller: Caller) -> dict[str, Any]:
    found = await ns_service.list_visible(state.store, caller)
    return {"namespaces": [ns.to_json() for ns in found]}


@router.post("", status_code=201, summary="Create a namespace (admin)")
async def create_namespace(body: NamespaceIn, state: State, caller: Caller) -> dict[str, Any]:
    created = await ns_service.create(state.store, caller, body.name, state.clock())
    return created.to_json()


@router.post("/{ns}/tokens", status_code=201, summary="Create a token for a namespace (admin)")
async def create_token(
    ns: str, state: State, caller: Caller, body: TokenIn | None = None
) -> dict[str, Any]:
    issued = await ns_service.issue_token(
        state.store, caller, ns, body.name if body else None, state.clock()
    )
    return issued.to_json()


@router.get("/{ns}/tokens", summary="List a namespace's tokens, revoked ones included (admin)")
async def list_tokens(ns: str, state: State, caller: Caller) -> dict[str, Any]:
    """Each token's ``id``, ``name``, ``createdAt`` and ``revokedAt`` (null while it is
    live), oldest first; never a secret. Tokens minted for launched daemons are not
    listed (the controller revokes each when its daemon is stopped)."""
    return {"tokens": await ns_service.list_tokens(state.store, caller, ns)}


@router.delete("/{ns}/tokens/{token_id}", summary="Revoke a namespace token (admin)")
async def revoke_token(ns: str, token_id: str, state: State, caller: Caller) -> dict[str, Any]:
    """From the next request on this server, and within a second on every replica, the
    token is refused (401). Revoking a revoked token changes nothing (its ``revokedAt``
    stays); the record is kept, so ``GET …/tokens`` still shows it."""
    revoked = await ns_service.revoke_token(state.store, caller, ns, token_id, state.clock())
    state.callers.forget(token_id)
    return revoked
