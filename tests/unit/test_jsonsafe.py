"""What a store can keep: refusals name the path and the reason; sizes are the stored bytes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from lakeshore.domain.jsonsafe import (
    Problem,
    find_unstorable,
    printable,
    require_storable,
    require_within,
    stored,
)
from lakeshore.errors import InvalidInput, PayloadTooLarge

NUL = "text may not contain NUL characters"
SURROGATE = "text must be valid UTF-8 (it holds a lone surrogate)"
NOT_FINITE = "NaN and infinite numbers are not valid JSON"


def _nested(levels: int) -> list[Any]:
    """A list holding a list … ``levels`` deep, an empty one innermost."""
    value: list[Any] = []
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("plain", None),
        ({"a": [1, 2.5, None, True, {"b": "c"}]}, None),
        ("a\x00b", Problem("", NUL)),
        ("\ud800", Problem("", SURROGATE)),
        (float("nan"), Problem("", NOT_FINITE)),
        ([1, float("-inf")], Problem("[1]", NOT_FINITE)),
        ({"a": {"b\x00": 1}}, Problem("a.b\x00", NUL)),  # a bad key
        ({"a": [{"b": "\udfff"}]}, Problem("a[0].b", SURROGATE)),
        ({1: "x", None: ["y"]}, None),  # keys that are not text are not checked as text
        (_nested(31), None),  # as deep as may be
        (_nested(32), Problem("[0]" * 32, "nested deeper than 32 levels")),
        ({"a": _nested(31)}, Problem("a" + "[0]" * 31, "nested deeper than 32 levels")),
        ([1, "ok", {"a": [None, float("inf")]}], Problem("[2].a[1]", NOT_FINITE)),
    ],
)
def test_find_unstorable_names_the_path_and_the_reason(value: Any, problem: Problem | None) -> None:
    assert find_unstorable(value) == problem


# (value, where, field, exact message)
REFUSALS = [
    pytest.param("a\x00", "", None, NUL, id="the value itself, nowhere"),
    pytest.param("a\x00", "description", "description", f"description: {NUL}", id="under where"),
    pytest.param({"k": "\x00"}, "", "k", f"k: {NUL}", id="a key, nowhere"),
    pytest.param(
        {"k": "\x00"}, "authPolicy", "authPolicy.k", f"authPolicy.k: {NUL}", id="a key under where"
    ),
    pytest.param(
        [float("nan")], "args", "args[0]", f"args[0]: {NOT_FINITE}", id="an item under where"
    ),
    pytest.param(
        {"\ud800": 1}, "x", "x.\\ud800", f"x.\\ud800: {SURROGATE}", id="the path is printable"
    ),
]


@pytest.mark.parametrize(("value", "where", "field", "message"), REFUSALS)
def test_require_storable_joins_where_and_the_path(
    value: Any, where: str, field: str | None, message: str
) -> None:
    with pytest.raises(InvalidInput) as caught:
        require_storable(value, where)
    assert (caught.value.field, caught.value.message) == (field, message)


def test_require_storable_hands_back_what_it_accepts() -> None:
    value = {"a": ["b", 1]}
    assert require_storable(value, "w") is value


@pytest.mark.parametrize(
    ("text", "shown"), [("ok", "ok"), ("a\x00b", "a\\0b"), ("x\ud800y", "x\\ud800y")]
)
def test_printable_escapes_nul_and_lone_surrogates(text: str, shown: str) -> None:
    assert printable(text) == shown


@pytest.mark.parametrize(
    ("value", "size"),
    [
        ({"a": [1, 2]}, len('{"a":[1,2]}')),  # compact: no spaces after , and :
        ("é", 4),  # UTF-8 bytes of the unescaped text, with its quotes
        ({"k": "\u20ac"}, len('{"k":""}') + 3),
        (None, 4),
    ],
)
def test_the_stored_form_is_the_compact_utf8_json(value: Any, size: int) -> None:
    assert len(stored(value)) == size
    assert json.loads(stored(value)) == value


def test_what_orjson_refuses_is_written_by_pythons_json() -> None:
    big = [2**70, {"k": -(2**80)}]
    assert stored(big) == b'[1180591620717411303424,{"k":-1208925819614629174706176}]'
    assert json.loads(stored(big)) == big


def test_a_value_at_the_cap_is_within_it() -> None:
    require_within("ab", 4, "result", setting="LAKESHORE_MAX_RESULT_BYTES", field="result")


def test_a_value_over_the_cap_is_refused_with_its_size_and_the_setting() -> None:
    with pytest.raises(PayloadTooLarge) as caught:
        require_within("x" * 1998, 1999, "args", setting="LAKESHORE_MAX_PAYLOAD_BYTES", field="a")
    assert caught.value.field == "a"
    assert caught.value.message == (
        "args: 2,000 bytes as JSON, over the cap of 1,999 (LAKESHORE_MAX_PAYLOAD_BYTES)"
    )
