"""The kinds a queue may have: its dispatch discipline and its elasticity policy.

Kept apart from the record's validation (``lakeshore.domain.queue``) so that the CLI can
name them without loading the record's models.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

QueueKind = Literal["fifo", "priority", "boltzmann", "filo"]
ElasticityKind = Literal[
    "fixed", "fully_elastic", "pool_with_threshold", "max_count", "wait_target"
]

QUEUE_KINDS: Final = get_args(QueueKind)
ELASTICITY_KINDS: Final = get_args(ElasticityKind)


def normalize_elasticity_kind(value: str) -> str:
    """The stored (underscored) spelling of a kind typed on the command line."""
    return value.strip().lower().replace("-", "_")
