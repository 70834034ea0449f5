"""Mapping between stored rows and domain values."""

from __future__ import annotations

from typing import Any, Final

from sqlalchemy import RowMapping

from lakeshore.domain.queue import Queue, QueueSpec

# camelCase field name in the record → column name in ``queues``
COLUMN_OF: Final = {(info.alias or name): name for name, info in QueueSpec.model_fields.items()}


def queue_columns(spec: QueueSpec) -> dict[str, Any]:
    data = spec.to_json()
    columns: dict[str, Any] = {column: data.get(field) for field, column in COLUMN_OF.items()}
    columns["pool"] = spec.elasticity.pool if spec.elasticity else None
    return columns


def queue_from_row(row: RowMapping) -> Queue:
    spec = QueueSpec.model_validate(
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
