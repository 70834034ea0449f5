"""Provider registrations: register, list, read, remove, and a provider's launches."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Query, Request

from lakeshore.api.deps import Caller, InNamespace, State
from lakeshore.errors import UnsupportedMediaType
from lakeshore.providers import KINDS
from lakeshore.services.fleet import providers as provider_service

router = APIRouter(prefix="/v1/namespaces/{ns}/providers", tags=["providers"])


def _body_schema() -> dict[str, Any]:
    schema = provider_service.ProviderBody.model_json_schema()
    schema["properties"]["kind"]["enum"] = sorted(KINDS)
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": schema}},
        }
    }


async def _json_only(request: Request) -> None:
    """Registrations are JSON: another declared media type is 415, not a confusing 422."""
    declared = request.headers.get("content-type")
    if declared is None:
        return
    media = declared.split(";", 1)[0].strip().lower()
    if media != "application/json" and not (
        media.startswith("application/") and media.endswith("+json")
    ):
        raise UnsupportedMediaType(
            f"send the provider as application/json, not {media or 'nothing'}"
        )


RawBody = Annotated[Any, Body()]


@router.get("", summary="List the namespace's providers")
async def list_providers(ns: InNamespace, state: State) -> dict[str, Any]:
    found = await provider_service.list_(state.store, ns)
    return {"providers": [provider.to_json() for provider in found]}


@router.post(
    "",
    status_code=201,
    summary="Register a provider: {name, kind, config}",
    openapi_extra=_body_schema(),
    dependencies=[Depends(_json_only)],
)
async def create_provider(
    ns: InNamespace, state: State, caller: Caller, body: RawBody
) -> dict[str, Any]:
    provider = await provider_service.create(state.store, caller, ns, body, state.clock())
    return provider.to_json()


@router.get("/{name}", summary="Read a provider")
async def get_provider(name: str, ns: InNamespace, state: State) -> dict[str, Any]:
    return (await provider_service.get(state.store, ns, name)).to_json()


@router.delete("/{name}", summary="Remove a provider (refused while a queue launches through it)")
async def delete_provider(name: str, ns: InNamespace, state: State) -> dict[str, Any]:
    return (await provider_service.delete(state.store, ns, name)).to_json()


@router.get("/{name}/launches", summary="A provider's launches, newest first")
async def list_launches(
    name: str,
    ns: InNamespace,
    state: State,
    limit: Annotated[
        int, Query(ge=1, le=provider_service.MAX_PAGE)
    ] = provider_service.DEFAULT_PAGE,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> dict[str, Any]:
    return await provider_service.launches(state.store, ns, name, limit, cursor)
