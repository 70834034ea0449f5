"""pydantic's validation errors as Lakeshore's: the field's path and words a user can act on."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from lakeshore.domain.validation import describe, field_path, invalid_input


def errors(*line_errors: Any) -> ValidationError:
    return ValidationError.from_exception_data("Spec", list(line_errors))


def missing(*loc: int | str) -> dict[str, Any]:
    return {"type": "missing", "loc": loc, "input": {}}


def value_error(text: str, *loc: int | str) -> dict[str, Any]:
    return {"type": "value_error", "loc": loc, "input": 1, "ctx": {"error": ValueError(text)}}


@pytest.mark.parametrize(
    ("loc", "path"),
    [
        ((), ""),
        (("elasticity", "max"), "elasticity.max"),
        (("args", 0), "args[0]"),
        (("a", 1, 2, "b"), "a[1][2].b"),
        ((0, "b"), "[0].b"),
    ],
)
def test_field_path_dots_names_and_brackets_positions(
    loc: tuple[int | str, ...], path: str
) -> None:
    assert field_path(loc) == path


@pytest.mark.parametrize(
    ("error", "field", "message"),
    [
        ({"loc": ("a",), "msg": "Value error, too big", "type": "value_error"}, "a", "too big"),
        ({"loc": ("a",), "msg": "Assertion failed, must hold"}, "a", "must hold"),
        ({"loc": ("a", "b"), "msg": "x", "type": "extra_forbidden"}, "a.b", "unknown field"),
        (
            {"loc": ("a",), "msg": "Field required", "type": "missing"},
            "a",
            "this field is required",
        ),
        ({"loc": (), "msg": "Input should be an object"}, None, "Input should be an object"),
        ({"msg": "no place"}, None, "no place"),  # no loc at all
        ({}, None, "invalid value"),  # nothing to go on
    ],
)
def test_describe_gives_the_field_and_plain_words(
    error: dict[str, Any], field: str | None, message: str
) -> None:
    assert describe(error) == (field, message)


@pytest.mark.parametrize(
    ("exc", "prefix", "field", "message"),
    [
        pytest.param(
            errors(value_error("too big", "max")), (), "max", "max: too big", id="one problem"
        ),
        pytest.param(
            errors(missing("fn")), ("invocations[0]",), "invocations[0].fn",
            "invocations[0].fn: this field is required", id="under a prefix",
        ),
        pytest.param(
            errors(missing("a"), missing("b")), (), "a",
            "a: this field is required (and 1 more problem)", id="two problems",
        ),
        pytest.param(
            errors(missing("a"), missing("b"), missing("c")), (), "a",
            "a: this field is required (and 2 more problems)", id="three problems",
        ),
        pytest.param(
            errors(value_error("not an object")), (), None, "not an object", id="no field"
        ),
        pytest.param(errors(), (), None, "invalid value", id="no problem reported"),
    ],
)  # fmt: skip
def test_invalid_input_names_the_first_problem_and_counts_the_rest(
    exc: ValidationError, prefix: tuple[str, ...], field: str | None, message: str
) -> None:
    refusal = invalid_input(exc, prefix=prefix)
    assert (refusal.field, refusal.message) == (field, message)
