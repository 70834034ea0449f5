"""Invocations: what a submit may carry, the states they move through, and retry timing.

An invocation is one call of a user function (``fn``, an import path ``module:qualname``)
with JSON ``args`` / ``kwargs``. It is ``pending`` until a worker claims it, ``running``
while that worker holds its lease, and ends ``succeeded``, ``failed``, ``cancelled`` or
``expired``. A claim counts as an attempt; an attempt that fails (or whose lease runs
out) goes back to ``pending`` after a backoff until ``max_attempts`` are spent.
"""

from __future__ import annotations

import functools
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictStr,
    TypeAdapter,
    ValidationError,
    field_validator,
)

from lakeshore.domain import jsonsafe
from lakeshore.domain.validation import invalid_input
from lakeshore.errors import InvalidInput

InvocationState = Literal["pending", "running", "succeeded", "failed", "cancelled", "expired"]
FINAL_STATES: Final = frozenset({"succeeded", "failed", "cancelled", "expired"})
DEFAULT_MAX_ATTEMPTS: Final = 3
MAX_ATTEMPTS_LIMIT: Final = 100
DEFAULT_PRIORITY_FIELD: Final = "priority"
_FN_MAX: Final = 512
_FN_RE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


@functools.lru_cache(maxsize=1024)
def is_import_path(fn: str) -> bool:
    """``module:qualname``. Remembered: a batch names a handful of functions, each
    checked twice a submit (a glance, then the model), and the match cost more than the
    rest of a plain submit's validation."""
    return _FN_RE.fullmatch(fn) is not None


class Submit(BaseModel):
    """One submit, as a client writes it."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False, frozen=True)

    fn: Annotated[StrictStr, Field(max_length=_FN_MAX)]
    args: list[Any] = Field(default_factory=list)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    key: Annotated[StrictStr, Field(min_length=1, max_length=256)] | None = None
    max_attempts: Annotated[int, Field(strict=True, ge=1, le=MAX_ATTEMPTS_LIMIT)] = (
        DEFAULT_MAX_ATTEMPTS
    )
    timeout_s: Annotated[float, Field(gt=0, le=7 * 24 * 3600)] | None = None

    @field_validator("fn")
    @classmethod
    def _import_path(cls, value: str) -> str:
        if not is_import_path(value):
            raise ValueError(
                f'{value!r} is not an import path of the form "package.module:function"'
            )
        return value


_FIELDS: Final = frozenset(Submit.model_fields)


def _plainly_storable(data: dict[str, Any]) -> bool:
    """True when a glance shows every store could keep ``data``: its names are the
    model's, ``fn`` is an import path (word characters only: no NUL, no lone surrogate),
    and the rest are empty or pass the walk. Walking the whole body of every submit was
    most of a batch's validation. A glance refuses nothing: when it is unsure, the full
    walk (then the model) decides, with its message."""
    if not _FIELDS.issuperset(data):
        return False
    for name, value in data.items():
        if name == "fn":
            # a long one is the model's to refuse, and is not remembered
            if type(value) is not str or len(value) > _FN_MAX or not is_import_path(value):
                return False
        elif value and jsonsafe.find_unstorable(value, depth=1) is not None:
            return False
    return True


def parse_submit(data: Any, *, where: str = "") -> Submit:
    """Validate one submit; :class:`InvalidInput` names the field (under ``where``)."""
    if not isinstance(data, dict):
        raise InvalidInput("an invocation is a JSON object with at least `fn`", field=where or None)
    if not _plainly_storable(data):
        jsonsafe.require_storable(data, where)
    try:
        return Submit.model_validate(data)
    except ValidationError as exc:
        raise invalid_input(exc, prefix=(where,) if where else ()) from exc


_SUBMITS: Final = TypeAdapter(list[Submit])


def parse_submits(bodies: Sequence[Any], places: Sequence[str]) -> list[Submit]:
    """Validate a request's submits (``places``: where each is, for refusals), as
    :func:`parse_submit` one by one would, refusing the first bad one with its message.
    When a glance finds every body plain, the model takes them all in one call, a third
    cheaper than one call each; a batch it refuses is gone through one by one, so the
    refusal is the one a body alone would get."""
    if all(type(body) is dict and _plainly_storable(body) for body in bodies):
        try:
            return _SUBMITS.validate_python(bodies)
        except ValidationError:
            pass
    return [parse_submit(body, where=place) for body, place in zip(bodies, places, strict=True)]


def priority_of(
    kwargs: dict[str, Any], field: str | None, *, ordered: bool = False, where: str = ""
) -> float:
    """The priority a submit carries in ``kwargs[field]`` (0 when absent or not a number).

    A JSON integer may be larger than any 64-bit float (``10**400``). To a queue ordered by
    priority (``ordered``) such a submit is refused (naming the field under ``where``),
    since it cannot be placed; elsewhere the priority orders nothing and it counts as 0,
    like any other non-number."""
    name = field or DEFAULT_PRIORITY_FIELD
    value = kwargs.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    try:
        number = float(value)
    except OverflowError:
        if ordered:
            path = f"{where}.kwargs.{name}" if where else f"kwargs.{name}"
            raise InvalidInput(
                f"{path}: a priority is a number a 64-bit float holds "
                f"(within ±{sys.float_info.max:.6g})",
                field=path,
            ) from None
        return 0.0
    return number if math.isfinite(number) else 0.0


def retry_backoff_s(attempts: int, *, base_s: float = 1.0, cap_s: float = 60.0) -> float:
    """Seconds before a failed attempt may be claimed again: 1, 2, 4, … capped at 60."""
    return float(min(cap_s, base_s * 2 ** max(0, attempts - 1)))


def after_failure(attempts: int, max_attempts: int, *, retry: bool) -> InvocationState:
    """Where an attempt that failed (or lost its lease) leaves the invocation."""
    return "pending" if retry and attempts < max_attempts else "failed"


@dataclass(frozen=True)
class Report:
    """One outcome a worker reports: a result, or an error (``retry``: may run again)."""

    invocation_id: str
    result: Any = None
    error: dict[str, Any] | None = None
    retry: bool = True
