"""Record ids: a short prefix naming the kind of record, then 20 random hex digits."""

from __future__ import annotations

import secrets


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(10)}"
