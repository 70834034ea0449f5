"""JSON text is read as Python's json reads it, whichever parser reads it."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lakeshore.jsontext import encoded, parsed

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=30,
)


@pytest.mark.parametrize(
    "text",
    [
        "18446744073709551615",  # the largest orjson reads as an integer
        "18446744073709551616",  # one more: orjson would read a float
        "-9223372036854775809",
        "[1, 123456789012345678901234567890]",
        '{"args": [10000000000000000000000], "id": "inv_1"}',
        "0.12345678901234567890123",
        '"\\ud800"',  # a lone surrogate: orjson refuses it
        "NaN",
        "1e400",
        '{"a": 1, "a": 2}',
    ],
)
def test_edges_read_as_pythons_json_reads_them(text: str) -> None:
    expected, got = json.loads(text), parsed(text.encode())
    assert type(got) is type(expected)
    if isinstance(expected, float) and math.isnan(expected):
        assert math.isnan(got)
    else:
        assert got == expected


@given(JSON)
def test_any_value_reads_back_as_pythons_json_reads_it(value: Any) -> None:
    text = json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")
    got = parsed(text)
    assert got == json.loads(text)
    assert json.dumps(got) == json.dumps(json.loads(text))  # ints stay ints, floats floats


@given(JSON)
def test_any_value_is_written_to_read_back_the_same(value: Any) -> None:
    """Integers past 64 bits included, which orjson refuses to write."""
    got = parsed(encoded(value))
    assert json.dumps(got) == json.dumps(value)  # ints stay ints, floats floats


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ([2**64 + 1, -(2**63) - 1], b"[18446744073709551617,-9223372036854775809]"),
        ({"n": int("7" * 300)}, b'{"n":' + b"7" * 300 + b"}"),
        (2**64 - 1, b"18446744073709551615"),  # orjson's own
        ({"x": None, "y": "é"}, '{"x":null,"y":"é"}'.encode()),
        ([None, float("nan")], b"[null,NaN]"),  # not [null,null]: the server refuses it
        ([float("inf")], b"[Infinity]"),
        ({1: 2}, b'{"1":2}'),  # as Python's json writes a key that is not text
        (["\ud800"], b'["\\ud800"]'),  # a lone surrogate, escaped
    ],
)
def test_edges_are_written_as_pythons_json_writes_them(value: Any, text: bytes) -> None:
    assert encoded(value) == text


def test_what_only_orjson_writes_stays_written() -> None:
    """A datetime among the args of an SDK submit, as before, even beside a ``null``."""
    when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert encoded({"at": when, "none": None}) == b'{"at":"2026-01-02T03:04:05+00:00","none":null}'
    with pytest.raises(TypeError):
        encoded([object()])
