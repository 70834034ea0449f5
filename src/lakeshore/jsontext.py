"""Reading and writing JSON text fast without reading or writing it differently.

orjson parses and writes several times faster than Python's json module, but not always
the same values: it reads an integer past 64 bits (≥ 2**64 or < -2**63) as a float and
refuses to write one, writes ``NaN`` as ``null``, and refuses ``NaN``, ``1e400`` and lone
surrogates, which Python's json reads. :func:`parsed` and :func:`encoded` take orjson only
where the two agree, so a number never changes on the way. Every body or answer the
server, the SDK, the CLI and the daemon read goes through :func:`parsed` (the server's
framework routes read theirs with Python's json, the same values); the SDK writes its
requests with :func:`encoded`. A daemon reads its claim and report answers (hundreds of
invocations with their args) through it; it imports nothing else, so the daemon's start
stays light.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

_LONG_DIGITS = re.compile(rb"[0-9]{19}")  # a number that may not fit 64 bits, or text


def parsed(raw: bytes) -> Any:
    """``raw`` read exactly as ``json.loads`` reads it: by orjson, unless a run of 19
    digits may be an integer past 64 bits, or orjson refuses the text. Raises what
    ``json.loads`` raises: ``ValueError`` (``json.JSONDecodeError``, or an integer of
    more digits than Python converts) and ``RecursionError`` (nesting too deep)."""
    if _LONG_DIGITS.search(raw) is None:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    return json.loads(raw)


def encoded(value: Any) -> bytes:
    """``value`` as compact UTF-8 JSON that :func:`parsed` reads back as the same value:
    by orjson, unless it refuses the value (an integer past 64 bits, a key that is not
    text) or wrote a ``null`` that may stand for a NaN or an infinity; then as Python's
    json writes it (a NaN as ``NaN``, which the server refuses by name, not as a
    ``null`` it would take). What only orjson writes (a datetime, a dataclass) stays
    orjson's. A value neither writes raises ``TypeError`` (or ``ValueError``: a cycle)."""
    fast: bytes | None
    try:
        fast = orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        fast = None
    else:
        if b"null" not in fast:
            return fast
    try:
        written = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    except TypeError:
        if fast is None:
            raise
        return fast
    try:
        return written.encode()
    except UnicodeEncodeError:  # a lone surrogate: escaped, for the server to refuse by name
        return json.dumps(value, separators=(",", ":")).encode()
