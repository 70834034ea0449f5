"""Turning pydantic's validation errors into Lakeshore's, with the field they are about."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from lakeshore.errors import InvalidInput


def field_path(loc: Sequence[int | str]) -> str:
    """``("elasticity", "max")`` → ``"elasticity.max"``; list positions as ``[i]``."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path


def describe(error: Any) -> tuple[str | None, str]:
    """One pydantic error dict → (field, message) in words a user can act on."""
    field = field_path(error.get("loc", ())) or None
    message = str(error.get("msg", "invalid value"))
    for prefix in ("Value error, ", "Assertion failed, "):
        message = message.removeprefix(prefix)
    if error.get("type") == "extra_forbidden":
        message = "unknown field"
    elif error.get("type") == "missing":
        message = "this field is required"
    return field, message


def invalid_input(exc: ValidationError, *, prefix: Sequence[str] = ()) -> InvalidInput:
    errors = exc.errors()
    first: dict[str, Any] = dict(errors[0]) if errors else {}
    first["loc"] = (*prefix, *first.get("loc", ()))
    field, message = describe(first)
    text = f"{field}: {message}" if field else message
    if len(errors) > 1:
        text += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return InvalidInput(text, field=field)
