"""Record ids: a short prefix naming the kind of record, then 20 random hex digits."""

from __future__ import annotations

import secrets


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(10)}"


def new_ids(prefix: str, count: int) -> list[str]:
    """``count`` ids as :func:`new_id` makes them, from one draw of random bytes (a
    batch's thousand draws cost more than the rest of its rows)."""
    digits = secrets.token_hex(10 * count)
    return [f"{prefix}_{digits[i : i + 20]}" for i in range(0, 20 * count, 20)]
