"""A refused setting as one line a user can act on: the name it was given under (the flag,
the variable as written, or the file's key) and what the setting takes.

``ELASTICITY_INTERVAL_S: expected a number at least 0.1, got 'abc'``. A setting that
may hold a secret (the admin token, a database URL's password) is never echoed.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import ValidationError
from pydantic.fields import FieldInfo

from lakeshore.config import ENV_PREFIX, SPEC_NAMES, ConfigFile, Settings

SECRET = frozenset({"admin_token", "database_url"})
_SHOWN_CHARS = 60


def refusals(
    exc: ValidationError,
    flags: Mapping[str, str],
    environ: Mapping[str, str],
    chosen: ConfigFile | None,
) -> list[str]:
    """One line per refused setting; ``flags`` maps the settings given as flags to the
    flag's name."""
    lines = []
    for error in exc.errors(include_url=False):
        field = str(error["loc"][0]) if error["loc"] else ""
        where = given_as(field, flags, environ, chosen)
        lines.append(f"{where}: {_problem(field, error)}")
    return lines


def given_as(
    field: str, flags: Mapping[str, str], environ: Mapping[str, str], chosen: ConfigFile | None
) -> str:
    """The name the winning value of ``field`` was written under (flag > env > file)."""
    if field in flags:
        return flags[field]
    names = [ENV_PREFIX + field.upper()]
    names += [name for name, target in SPEC_NAMES.items() if target == field]
    for name in names:
        for key in environ:
            if key.upper() == name:
                return key
    if chosen is not None:
        return f"{chosen.path}: {field}"
    return field


def expected(field: FieldInfo) -> str:
    """What a field takes, in words: ``a number greater than 0 and at most 3600``."""
    kind = _kind(field.annotation)
    bounds = []
    for item in field.metadata:
        if isinstance(item, annotated_types.Gt):
            bounds.append(f"greater than {_number(item.gt)}")
        elif isinstance(item, annotated_types.Ge):
            bounds.append(f"at least {_number(item.ge)}")
        elif isinstance(item, annotated_types.Lt):
            bounds.append(f"less than {_number(item.lt)}")
        elif isinstance(item, annotated_types.Le):
            bounds.append(f"at most {_number(item.le)}")
        elif isinstance(item, annotated_types.MinLen) and item.min_length == 1:
            bounds.append("not empty")
    return " ".join([kind, " and ".join(bounds)]).strip()


def _problem(field: str, error: Any) -> str:
    if error["type"] == "value_error":
        return str(error["msg"]).removeprefix("Value error, ")
    if error["type"] == "extra_forbidden" or field not in Settings.model_fields:
        return "not a setting"
    wanted = f"expected {expected(Settings.model_fields[field])}"
    if field in SECRET:
        return wanted
    shown = repr(error["input"])
    if len(shown) > _SHOWN_CHARS:
        shown = shown[: _SHOWN_CHARS - 1] + "…"
    return f"{wanted}, got {shown}"


def _kind(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        real = [arg for arg in get_args(annotation) if arg is not type(None)]
        return _kind(real[0]) if len(real) == 1 else "a value"
    if origin is Literal:
        return "one of " + ", ".join(str(arg) for arg in get_args(annotation))
    return {
        bool: "true or false",
        int: "an integer",
        float: "a number",
        Path: "a path",
        str: "text",
    }.get(annotation, "a value")


def _number(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
