"""The signals the controller reads, computed from counts."""

from __future__ import annotations


def utilization(*, running: int, capacity: int, pending: int) -> float:
    """Running invocations over the fleet's capacity, in [0, 1].

    With no capacity the ratio is undefined; it reads 1.0 when work is waiting (a full,
    if empty, fleet) and 0.0 otherwise, so ``pool_with_threshold`` with ``min: 0`` can
    both leave zero and return to it.
    """
    if capacity > 0:
        return min(1.0, running / capacity)
    return 1.0 if pending > 0 else 0.0
