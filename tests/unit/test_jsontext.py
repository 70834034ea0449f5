"""JSON text is read as Python's json reads it, whichever parser reads it."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lakeshore.jsontext import parsed

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
