"""Manual fleet commands — the ``fixed`` policy's tools: launch daemons for a queue, list
them, kill one. They go through the same provider, launch-tracker and retire paths as the
controller, so a manual launch counts as in flight for the queue's next tick and a manual
kill is refused for a busy worker just as the controller never kills one.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lakeshore.domain import fleet
from lakeshore.domain.names import Name
from lakeshore.domain.validation import invalid_input
from lakeshore.errors import Conflict, InvalidInput, NotFound, ProviderFailed
from lakeshore.services import queues as queue_service
from lakeshore.services.fleet import scopes
from lakeshore.services.fleet.fleet_ops import FleetOps
from lakeshore.services.namespaces import Namespace
from lakeshore.store import controller as ctl_store
from lakeshore.store import queues as queue_store
from lakeshore.store import workers as worker_store
from lakeshore.store.engine import Store

MAX_AT_ONCE = 100


class LaunchIn(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    queue: Name
    provider: Name | None = None
    count: Annotated[int, Field(ge=1, le=MAX_AT_ONCE)] = 1


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def worker_json(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row["name"],
        "queues": row["queues"],
        "runners": row["runners"],
        "tags": row["tags"],
        "capacity": row["max_invocations"],
        "running": row["running"],
        "launchId": row["launch_id"],
        "provider": row["provider"],
        "retiring": row["retiring"],
        "lastSeenAt": _iso(row["last_seen_at"]),
        "createdAt": _iso(row["created_at"]),
    }


async def launch(store: Store, ops: FleetOps, ns: Namespace, body: Any) -> dict[str, Any]:
    """Launch ``count`` daemons for a queue through its provider (or the one named)."""
    if not isinstance(body, dict):
        raise InvalidInput('launch takes {"queue", "provider"?, "count"?}')
    try:
        request = LaunchIn.model_validate(body)
    except ValidationError as exc:
        raise invalid_input(exc) from exc
    queue = await queue_service.get(store, ns, request.queue)
    name = request.provider or fleet.provider_name(queue.spec)
    if name is None:
        raise InvalidInput(
            f'queue "{queue.name}" has no providerRef / daemonTemplate.provider: name one',
            field="provider",
        )
    async with store.read() as conn:
        registration = await ctl_store.registration(conn, ns.id, name)
    if registration is None:
        raise NotFound(f'provider "{name}" not found', field="provider")
    results = []
    for _ in range(request.count):
        launched = await ops.launch(
            namespace_id=ns.id,
            namespace=ns.name,
            scope=scopes.scope_of(queue),
            provider_name=name,
            registration=registration,
            template=queue.spec.daemon_template,
            membership=fleet.membership(queue.name),
        )
        results.append(
            {
                "launchId": launched.launch_id,
                "state": "failed" if launched.failure else "in_flight",
                "error": launched.failure,
            }
        )
    if all(r["error"] for r in results):
        raise ProviderFailed(str(results[0]["error"]), field="provider")
    return {"queue": queue.name, "provider": name, "launches": results}


async def list_(store: Store, ns: Namespace, queue: str | None = None) -> dict[str, Any]:
    async with store.read() as conn:
        queue_id = None
        if queue is not None:
            found = await queue_store.get_queue(conn, ns.id, queue)
            if found is None:
                raise NotFound(f'queue "{queue}" not found', field="queue")
            queue_id = found.id
        rows = await worker_store.list_for_namespace(conn, ns.id, queue_id)
    return {"daemons": [worker_json(row) for row in rows]}


async def kill(store: Store, ops: FleetOps, ns: Namespace, worker_id: str) -> dict[str, Any]:
    """Retire one idle daemon (its provider stops it); a busy one is refused."""
    async with store.read() as conn:
        found = len(worker_id) <= 40
        row = await worker_store.get_by_name(conn, ns.id, worker_id) if found else None
    if row is None:
        raise NotFound(f'daemon "{worker_id}" not found', field="id")
    retired = await ops.retire(namespace_id=ns.id, worker_id=row["id"], reason="killed by hand")
    if retired.failure is not None:
        raise ProviderFailed(retired.failure, field="id")
    if retired.status == "busy":
        raise Conflict(
            f'daemon "{worker_id}" is running invocations; busy daemons are not killed '
            "(drain its queue or wait)",
            field="id",
        )
    if retired.status == "gone":
        raise NotFound(f'daemon "{worker_id}" not found', field="id")
    return {"id": worker_id, "state": "retired"}
