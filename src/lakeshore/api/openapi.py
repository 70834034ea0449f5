"""The published schema: FastAPI's, plus the queue record's own JSON Schema.

Queue bodies are validated by the domain (one set of rules and messages for the API and
for ``lakeshore.yaml``), so routes take them raw; this adds their schema back so clients
and fuzzers see the real shape.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from enum import Enum
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from lakeshore.domain.queue import QueueSpec

_REF = "#/components/schemas/{model}"


def _queue_schemas() -> dict[str, Any]:
    spec = QueueSpec.model_json_schema(by_alias=True, ref_template=_REF)
    schemas: dict[str, Any] = spec.pop("$defs", {})
    schemas["QueueSpec"] = spec
    patch = copy.deepcopy(spec)
    patch.pop("required", None)
    patch["title"] = "QueuePatch"
    schemas["QueuePatch"] = patch
    return schemas


def install(app: FastAPI, *, tags: Sequence[str | Enum] = ()) -> None:
    """Serve the schema; ``tags`` orders the groups the documentation shows (routes are
    matched, and so listed, in another order: the hot paths first)."""
    ordered = [{"name": str(tag)} for tag in dict.fromkeys(tags)]

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                routes=app.routes,
                description=app.description,
                tags=ordered or None,
            )
            schema.setdefault("components", {}).setdefault("schemas", {}).update(_queue_schemas())
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
