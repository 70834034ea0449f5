"""Hypothesis strategies for the edges of a request: path, query string, headers, and the
leaves of a body.

The schema-driven fuzzers draw values from what the published schema says (a string, an
integer); the bugs were at what the schema cannot say: the store's column widths, the
date arithmetic, the text a database keeps. These strategies draw from there on purpose:

- ``ints()`` — integers at and past every width the stores hold: ``±2**31``, ``±2**63``,
  ``2**64``, ``10**19``, ``10**400`` (past a 64-bit float), their neighbours, 0 and -1,
  then any integer.
- ``floats()`` — the largest and smallest floats, subnormals, ``-0.0``, NaN and the
  infinities, then any float.
- ``texts()`` — NUL alone and inside text, lone surrogates, a byte-order mark, a
  right-to-left override, NEL, control characters, emoji, combining marks, the empty and
  the blank string, dot segments and slashes, 300 and 5,000 characters, numbers spelled
  as text (``"²"``, Arabic-Indic digits, ``"1e3"``), then any text (surrogates included).
- ``timestamps()`` — cursors of the ``<ISO time>|<id>`` kind whose time in UTC falls
  outside years 1-9999 (``9999-12-31T23:59:59-23:59``), without a zone, or is no time;
  then any datetime with an offset of up to ±23:59.
- ``segments(valid)`` — one path segment, percent-encoded: a seeded id (so the request
  reaches past the 404), any of ``texts()`` or ``ints()``, or raw bytes (``%FF``, an
  encoded surrogate ``%ED%A0%80``, ``%00``).
- ``query_values(kind)`` — a query parameter's value for its schema type: integers
  from ``ints()`` (and ``"1.5"``, ``"+1"``, ``" 1"``, ``"0x10"``), booleans in every
  spelling, strings from ``texts()`` and ``timestamps()``.
- ``header_values()`` — raw header bytes: ``texts()`` as UTF-8, numbers from ``ints()``,
  any bytes (NUL, 0xFF).
- ``authorizations()`` — Authorization headers that open nothing: no scheme, Basic, a
  token with a NUL, 5,000 characters, our token shape with a wrong id or secret.
- ``mutated(template)`` — a valid body with one or two leaves replaced by one of the
  above, a key dropped or an unknown key added; or any JSON at all (``null``, a list,
  nesting 30-40 deep, NaN).

The ``SWEEP_*`` constants hold one value of each kind of edge, for a sweep that puts every
one in every place of every operation, one at a time: a bounded random run reaches a given
value in a given place only now and then (at the code before the fixes, the random run's
8 examples an operation found 1 of the 25 operations that answered 500; the sweep found
all 25). The strategies draw from them too, and from the rest of their space.
"""

from __future__ import annotations

import json
import math
import sys
from datetime import timedelta, timezone
from typing import Any
from urllib.parse import quote

from hypothesis import strategies as st

WIDTHS = (2**31, 2**53, 2**63, 2**64)
EDGE_INTS = (
    0,
    -1,
    1,
    10**19,
    10**400,
    -(10**400),
    *(w + d for w in WIDTHS for d in (-1, 0, 1)),
    *(-w + d for w in WIDTHS for d in (-1, 0, 1)),
)
EDGE_FLOATS = (
    sys.float_info.max,
    -sys.float_info.max,
    sys.float_info.min,
    5e-324,
    -0.0,
    1e308,
    1e-308,
    math.nan,
    math.inf,
    -math.inf,
    0.5,
    1e11,  # past the deadline bound, within a float
)
ODD_TEXTS = (
    "\x00",
    "a\x00b",
    "\ud800",
    "x\udfff",
    "",
    " ",
    "\t",
    "\ufeff",
    "\u202e",
    "\u0085",
    "\x7f",
    "\x1b[31m",
    "\n",
    "😀",
    "e\u0301",
    ".",
    "..",
    "a/b",
    "%00",
    "null",
    "²",
    "١٢٣",
    "1e3",
    "x" * 300,
    "y" * 5000,
)
ODD_TIMESTAMPS = (
    "9999-12-31T23:59:59-23:59|x",
    "0001-01-01T00:00:00+23:59|x",
    "9999-12-31T23:59:59.999999+00:00|inv_0",
    "2026-01-01T00:00:00|x",  # no zone
    "2026-13-01T00:00:00+00:00|x",
    "2026-01-01T00:00:00+00:00|",
    "2026-01-01T00:00:00+00:00|\x00",
    "|",
    "not-a-time|x",
)
HOSTILE_BYTES = (b"%00", b"%FF", b"%ED%A0%80", b"%C0%80", b"%F4%90%80%80", b"%", b"%zz")
BOOLEAN_SPELLINGS = ("true", "false", "1", "0", "yes", "off", "TRUE", "", "2", "truee")


SWEEP_SEGMENTS = (
    "%00",
    "%FF",
    "%ED%A0%80",  # a lone surrogate, as UTF-8 would spell it
    "9223372036854775808",
    "x" * 300,
)
SWEEP_QUERY = {
    "integer": (
        "-1",
        "2147483648",
        "9223372036854775808",
        "-9223372036854775809",
        "1" + "0" * 400,
        "\x00",
    ),
    "number": ("-1", "1e400", "NaN", "\x00"),
    "boolean": ("2", "\x00"),
    "string": (
        "\x00",
        "\ud800",
        "18446744073709551616",
        "9999-12-31T23:59:59-23:59|x",
        "0001-01-01T00:00:00+23:59|x",
        "x" * 300,
    ),
}
SWEEP_HEADERS = (b"\x00", b"1\x00", b"10000000000000000000", b"2147483648", b"\xff", "²".encode())
SWEEP_AUTHORIZATIONS = (
    b"",
    b"Bearer ",
    b"Basic YWRtaW46YWRtaW4=",
    b"Bearer lks_" + b"0" * 32 + b"_not-a-secret-we-issued",
    b"Bearer lks_" + b"0" * 31 + b"\x00_secret",
    b"Bearer \x00",
    b"Bearer " + b"t" * 5000,
    b"Bearer \xff\xfe",
)
SWEEP_CONTENT_TYPES = (b"application/json\x00", b"text/plain")
# what replaces a body's leaf, by what the leaf was
SWEEP_LEAVES: dict[str, tuple[Any, ...]] = {
    "text": ("\x00", "\ud800", "", 2**63, None),
    "number": (2**31, 2**63, -(2**63) - 1, 10**400, -1, 1e308, math.nan, "\x00", None),
    "boolean": ("\x00", 2, None),
    "object": (None, "\x00", 2**63, []),
    "array": (None, "\x00", 2**63, {}),
}
SWEEP_BODIES: tuple[Any, ...] = (None, [], json.loads("[" * 40 + "]" * 40))


def leaf_kind(value: Any) -> str:
    """Which ``SWEEP_LEAVES`` replace ``value``."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    return "text"


def at(value: Any, path: tuple[Any, ...]) -> Any:
    """What is at ``path`` (see :func:`places`) in ``value``."""
    for key in path:
        value = value[key]
    return value


def ints() -> st.SearchStrategy[int]:
    return st.one_of(st.sampled_from(EDGE_INTS), st.integers())


def floats() -> st.SearchStrategy[float]:
    return st.one_of(st.sampled_from(EDGE_FLOATS), st.floats())


def texts() -> st.SearchStrategy[str]:
    any_text = st.text(st.characters() | st.characters(categories=["Cs"]), max_size=24)
    return st.one_of(st.sampled_from(ODD_TEXTS), any_text)


def timestamps() -> st.SearchStrategy[str]:
    drawn = st.builds(
        # any wall time with any offset: near years 1 and 9999 its UTC time is out of range
        lambda moment, minutes, tail: (
            f"{moment.replace(tzinfo=timezone(timedelta(minutes=minutes))).isoformat()}|{tail}"
        ),
        st.datetimes(),
        st.integers(-(23 * 60 + 59), 23 * 60 + 59),
        st.sampled_from(["inv_00", "lch_00", "x"]) | texts(),
    )
    return st.one_of(st.sampled_from(ODD_TIMESTAMPS), drawn)


def encode(text: str) -> str:
    """``text`` as one percent-encoded path segment or query value (surrogates kept)."""
    return quote(text, safe="", errors="surrogatepass")


def segments(valid: list[str]) -> st.SearchStrategy[str]:
    """One path segment, already percent-encoded."""
    return st.one_of(
        st.sampled_from(valid) if valid else st.nothing(),
        st.sampled_from(SWEEP_SEGMENTS),
        st.sampled_from(HOSTILE_BYTES).map(bytes.decode),
        texts().map(encode),
        ints().map(str),
        st.binary(min_size=1, max_size=6).map(lambda raw: quote(raw, safe="")),
    )


def query_values(kind: str) -> st.SearchStrategy[str]:
    """A query value for a parameter of schema type ``kind`` — not yet encoded."""
    if kind in ("integer", "number"):
        typed = st.one_of(
            ints().map(str),
            floats().map(repr),
            st.sampled_from(["1.5", "+1", " 1", "0x10", "1_000", "-0", "NaN", "inf"]),
        )
    elif kind == "boolean":
        typed = st.sampled_from(BOOLEAN_SPELLINGS)
    else:
        typed = st.one_of(timestamps(), ints().map(str))
    swept = SWEEP_QUERY.get(kind, SWEEP_QUERY["string"])
    return st.one_of(st.sampled_from(swept), typed, texts())


def header_values() -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.sampled_from(SWEEP_HEADERS),
        ints().map(lambda n: str(n).encode()),
        texts().map(lambda text: text.encode("utf-8", "surrogatepass")),
        st.binary(max_size=12),
    )


def authorizations() -> st.SearchStrategy[bytes]:
    """Authorization headers that open nothing."""
    shaped = "lks_" + "0" * 32 + "_not-a-secret-we-issued"
    return st.one_of(
        st.sampled_from([*SWEEP_AUTHORIZATIONS, b"Bearer", shaped.encode()]),
        header_values().map(lambda value: b"Bearer " + value),
    )


def json_leaves() -> st.SearchStrategy[Any]:
    """A value to put where a body had a leaf."""
    swept = sorted({repr(v): v for kind in SWEEP_LEAVES.values() for v in kind}.items())
    return st.one_of(
        st.sampled_from([value for _, value in swept]),
        ints(),
        floats(),
        texts(),
        st.sampled_from([False, [None], {"": None}]),
    )


def any_json() -> st.SearchStrategy[Any]:
    deep = st.integers(30, 40).map(lambda depth: json.loads("[" * depth + "]" * depth))
    nested = st.recursive(
        json_leaves(),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts(), inner, max_size=3),
        max_leaves=8,
    )
    return st.one_of(st.sampled_from([None, [], "", 0, "x"]), deep, nested)


def places(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a leaf (and to every container) of a JSON value."""
    found = [path] if path else []
    if isinstance(value, dict):
        for key, item in value.items():
            found += places(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found += places(item, (*path, i))
    return found


def put(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    """A copy of ``value`` with what is at ``path`` (see :func:`places`) replaced by ``new``."""
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: put(value[head], rest, new)}
    copy = list(value)
    copy[head] = put(value[head], rest, new)
    return copy


def _drop(value: Any, path: tuple[Any, ...]) -> Any:
    if len(path) == 1:
        if isinstance(value, dict):
            return {k: v for k, v in value.items() if k != path[0]}
        return [v for i, v in enumerate(value) if i != path[0]]
    head = path[0]
    if isinstance(value, dict):
        return {**value, head: _drop(value[head], path[1:])}
    copy = list(value)
    copy[head] = _drop(value[head], path[1:])
    return copy


@st.composite
def _edit(draw: st.DrawFn, body: Any) -> Any:
    paths = places(body)
    if not paths:
        return draw(json_leaves())
    path = draw(st.sampled_from(paths))
    action = draw(st.sampled_from(["replace", "replace", "replace", "drop", "add"]))
    if action == "replace":
        return put(body, path, draw(json_leaves()))
    if action == "drop":
        return _drop(body, path)
    if isinstance(body, dict):
        return {**body, draw(st.sampled_from(["x", "", "\x00", "id"])): draw(json_leaves())}
    return body


@st.composite
def _edited(draw: st.DrawFn, template: Any) -> Any:
    body = template
    for _ in range(draw(st.integers(1, 2))):
        body = draw(_edit(body))
    return body


def mutated(template: Any) -> st.SearchStrategy[Any]:
    """Mostly ``template`` with an edit or two; sometimes untouched, sometimes any JSON."""
    return st.one_of(_edited(template), _edited(template), st.just(template), any_json())
