"""What a store can keep: JSON that both SQLite and PostgreSQL take back unchanged.

User-written JSON (a whole queue body, ``authPolicy``, unknown ``elasticity`` keys) is
checked before it goes anywhere: no NUL characters (PostgreSQL stores them in neither text
nor JSON), no lone surrogates (not UTF-8, so no store, log or response can carry them), no
NaN or infinities (not JSON), and no nesting deeper than :data:`MAX_DEPTH` (a record is
configuration, not a data structure). Refusals name the path of the offending value.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Annotated, Any, Final

import orjson
from pydantic import AfterValidator

from lakeshore.errors import InvalidInput, PayloadTooLarge

MAX_DEPTH: Final = 32


@dataclass(frozen=True)
class Problem:
    path: str
    reason: str


def printable(text: str) -> str:
    """``text`` made safe to show and to encode: NUL and lone surrogates escaped."""
    return text.replace("\x00", "\\0").encode("utf-8", "backslashreplace").decode("utf-8")


def _text_problem(text: str) -> str | None:
    if "\x00" in text:
        return "text may not contain NUL characters"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "text must be valid UTF-8 (it holds a lone surrogate)"
    return None


def check_text(value: str) -> str:
    """``value`` itself, or ValueError (for a pydantic validator) when no store could keep it."""
    reason = _text_problem(value)
    if reason:
        raise ValueError(reason)
    return value


# a request model's text that reaches the store as text (an id, a label): no NUL, no lone
# surrogate, refused with the field named
StorableText = Annotated[str, AfterValidator(check_text)]


def find_unstorable(value: Any, path: str = "", depth: int = 0) -> Problem | None:
    """The first value under ``value`` that no store could keep, if any. A first walk
    only looks (most values pass); a second, that names where, runs only when it did not
    pass: naming every child's path as it went was most of a batch's check."""
    if _storable(value, depth):
        return None
    return _find(value, path, depth)


def _storable(value: Any, depth: int) -> bool:
    """Whether :func:`_find` finds nothing under ``value``."""
    if isinstance(value, str):
        return _text_problem(value) is None
    if isinstance(value, float):
        return math.isfinite(value)
    if not isinstance(value, dict | list):
        return True
    if depth >= MAX_DEPTH:
        return False
    if isinstance(value, dict):
        if any(isinstance(key, str) and _text_problem(key) is not None for key in value):
            return False
        return all(_storable(item, depth + 1) for item in value.values())
    return all(_storable(item, depth + 1) for item in value)


def _find(value: Any, path: str, depth: int) -> Problem | None:
    if isinstance(value, str):
        reason = _text_problem(value)
        return Problem(path, reason) if reason else None
    if isinstance(value, float) and not math.isfinite(value):
        return Problem(path, "NaN and infinite numbers are not valid JSON")
    if not isinstance(value, dict | list):
        return None
    if depth >= MAX_DEPTH:
        return Problem(path, f"nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, dict):
        children = []
        for key, item in value.items():
            child = f"{path}.{key}" if path else str(key)
            reason = _text_problem(key) if isinstance(key, str) else None
            if reason:
                return Problem(child, reason)
            children.append((child, item))
    else:
        children = [(f"{path}[{i}]", item) for i, item in enumerate(value)]
    for child, item in children:
        found = _find(item, child, depth + 1)
        if found is not None:
            return found
    return None


def require_storable(value: Any, where: str = "") -> Any:
    """``value`` itself, or :class:`InvalidInput` naming the path (under ``where``) of the
    first part no store could keep."""
    problem = find_unstorable(value)
    if problem is None:
        return value
    inner = printable(problem.path)
    path = f"{where}{'' if not where or not inner or inner.startswith('[') else '.'}{inner}"
    raise InvalidInput(f"{path}: {problem.reason}" if path else problem.reason, field=path or None)


def stored(value: Any) -> bytes:
    """``value`` as compact UTF-8 JSON, as the stores keep it, for a storable value (one
    in which :func:`find_unstorable` finds nothing: orjson would write a NaN as
    ``null``). orjson writes it, several times faster than Python's json, which writes
    what orjson refuses (an integer over 64 bits)."""
    try:
        return orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        return text.encode("utf-8", "surrogatepass")


def require_within(value: Any, cap: int, what: str, *, setting: str, field: str) -> None:
    """:class:`PayloadTooLarge` when storable ``value`` takes more than ``cap`` bytes as
    the stores keep it (:func:`stored`)."""
    size = len(stored(value))
    if size > cap:
        raise PayloadTooLarge(
            f"{what}: {size:,} bytes as JSON, over the cap of {cap:,} ({setting})", field=field
        )
