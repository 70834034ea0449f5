"""Mapping between stored rows and domain values."""

from __future__ import annotations

import copy
from typing import Any, Final

from pydantic import ValidationError
from sqlalchemy import RowMapping

from lakeshore.domain.kinds import ELASTICITY_KINDS
from lakeshore.domain.queue import Elasticity, Queue, QueueSpec

# camelCase field name in the record → column name in ``queues``
COLUMN_OF: Final = {(info.alias or name): name for name, info in QueueSpec.model_fields.items()}


def queue_columns(spec: QueueSpec) -> dict[str, Any]:
    data = spec.to_json()
    columns: dict[str, Any] = {column: data.get(field) for field, column in COLUMN_OF.items()}
    columns["pool"] = spec.elasticity.pool if spec.elasticity else None
    return columns


def queue_from_row(row: RowMapping) -> Queue:
    spec = _spec_of(
        {field: row[column] for field, column in COLUMN_OF.items() if row[column] is not None}
    )
    return Queue(
        id=row["id"],
        namespace_id=row["namespace_id"],
        spec=spec,
        state=row["state"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


# a range error of pydantic's, and the key of its bound in the error's context
_BOUNDS: Final = {"less_than_equal": "le", "greater_than_equal": "ge"}


def _spec_of(data: dict[str, Any]) -> QueueSpec:
    """The stored record as a spec. A number stored before its range was bounded (an
    ``admission.deadline_cutoff_s`` over ten years, say) is read at the bound, rather than
    making the queue — and every list of its namespace — unreadable; the row keeps it
    until the queue is next written."""
    try:
        return _spec_as_stored(data)
    except ValidationError as exc:
        bounded = _at_the_bounds(data, exc)
        if bounded is None:
            raise
    return _spec_as_stored(bounded)


def _at_the_bounds(data: dict[str, Any], exc: ValidationError) -> dict[str, Any] | None:
    """``data`` with each number past a bound put at it; None when anything else is wrong."""
    bounded = copy.deepcopy(data)
    for error in exc.errors():
        key = _BOUNDS.get(error["type"])
        *parents, last = error["loc"]
        if key is None or not isinstance(error.get("input"), int | float):
            return None
        node: Any = bounded
        for part in parents:
            node = node[part]
        node[last] = error["ctx"][key]
    return bounded


def _spec_as_stored(data: dict[str, Any]) -> QueueSpec:
    """The stored record as a spec. An elasticity kind this server does not know (written
    by a newer server, or straight into the store) is kept as it is, rather than making
    the queue unreadable: the controller then ticks it as the spec says, ``unknown
    elasticity.kind="…" — defaulting to no-op``, and reads show the kind that is stored."""
    try:
        return QueueSpec.model_validate(data)
    except ValidationError:
        elasticity = data.get("elasticity")
        kind = elasticity.get("kind") if isinstance(elasticity, dict) else None
        if not isinstance(kind, str) or kind in ELASTICITY_KINDS:
            raise
    assert isinstance(elasticity, dict)
    spec = QueueSpec.model_validate({**data, "elasticity": {**elasticity, "kind": "fixed"}})
    assert spec.elasticity is not None
    kept: Elasticity = spec.elasticity.model_copy(update={"kind": kind})
    return spec.model_copy(update={"elasticity": kept})
