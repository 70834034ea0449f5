"""Invocations: what a submit may carry, the states they move through, and retry timing.

An invocation is one call of a user function (``fn``, an import path ``module:qualname``)
with JSON ``args`` / ``kwargs``. It is ``pending`` until a worker claims it, ``running``
while that worker holds its lease, and ends ``succeeded``, ``failed``, ``cancelled`` or
``expired``. A claim counts as an attempt; an attempt that fails (or whose lease runs
out) goes back to ``pending`` after a backoff until ``max_attempts`` are spent.

A submit may be delayed (``delay_s``, or ``not_before``: an RFC 3339 time with its
offset): it is ``pending`` with a due time (its ``available_at``, see :func:`due_at`),
claimable from then on, at most :data:`MAX_DELAY_S` ahead.
"""

from __future__ import annotations

import functools
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
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
from lakeshore.domain.retry import (
    DEFAULT,
    DEFAULT_MAX_ATTEMPTS,
    MAX_ATTEMPTS_LIMIT,
    RetryPolicy,
    RetrySpec,
    layered,
)
from lakeshore.domain.validation import invalid_input
from lakeshore.errors import InvalidInput

InvocationState = Literal["pending", "running", "succeeded", "failed", "cancelled", "expired"]
FINAL_STATES: Final = frozenset({"succeeded", "failed", "cancelled", "expired"})
DEFAULT_PRIORITY_FIELD: Final = "priority"
_FN_MAX: Final = 512
MAX_DELAY_S: Final = 365 * 24 * 3600  # a delayed submit is due at most a year ahead
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
    delay_s: Annotated[float, Field(ge=0, le=MAX_DELAY_S)] | None = None
    # RFC 3339 text: a strict model takes no text as a datetime, so it is read here
    not_before: Annotated[StrictStr, Field(max_length=64)] | None = None
    retry: RetrySpec | None = None  # this submit's fields of its retry policy
    # what the queue's per-key limits count and a claim takes turns by (a customer, a model)
    concurrency_key: Annotated[StrictStr, Field(min_length=1, max_length=256)] | None = None

    @field_validator("not_before")
    @classmethod
    def _rfc3339(cls, value: str | None) -> str | None:
        if value is not None:
            parse_time(value)
        return value

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


def parse_time(value: str) -> datetime:
    """An RFC 3339 time (``2026-05-01T09:30:00Z``, ``…+02:00``): its offset is required,
    since a time without one names no instant."""
    try:
        # a date alone, or a time written otherwise, is not RFC 3339
        if len(value) < 20 or value[10] not in "Tt ":
            raise ValueError(value)
        parsed = datetime.fromisoformat(value.upper().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{value!r} is not an RFC 3339 time with an offset, such as 2026-05-01T09:30:00Z"
        ) from None
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise ValueError(f"{value!r} has no offset: add Z (UTC) or one such as +02:00")
    return parsed


def due_at(submit: Submit, now: datetime, *, where: str = "") -> datetime:
    """When ``submit`` may first be claimed, submitted at ``now``: ``now`` plus its
    ``delay_s``, its ``not_before`` (``now`` when that has passed), or ``now``. Both,
    or a ``not_before`` more than :data:`MAX_DELAY_S` ahead, are refused, naming the
    field. (Not a model validator: that would run for every submit of a batch, and
    only a delayed one needs the check.)"""
    if submit.delay_s is not None and submit.not_before is not None:
        raise InvalidInput(
            f"{where or 'this invocation'}: give delay_s or not_before, not both",
            field=where or None,
        )
    if submit.delay_s is not None:
        return now + timedelta(seconds=submit.delay_s) if submit.delay_s else now
    if submit.not_before is None:
        return now
    due = parse_time(submit.not_before)
    if due - now > timedelta(seconds=MAX_DELAY_S):
        path = f"{where}.not_before" if where else "not_before"
        raise InvalidInput(
            f"{path}: {submit.not_before} is more than a year ({MAX_DELAY_S} s) ahead",
            field=path,
        )
    return max(due, now)


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


def retry_policy(submit: Submit, queue_retry: RetrySpec | None) -> RetryPolicy:
    """A submit's effective retry policy: its own fields (``max_attempts`` given beside
    ``retry`` wins), else its queue's, else the default (:mod:`.retry`)."""
    own: dict[str, Any] = submit.retry.given() if submit.retry is not None else {}
    if "max_attempts" in submit.model_fields_set:
        own["max_attempts"] = submit.max_attempts
    if not own and queue_retry is None:
        return DEFAULT
    return layered([own, queue_retry.given() if queue_retry is not None else None])


def after_failure(
    attempts: int, policy: RetryPolicy, *, retry: bool, error: dict[str, Any] | None = None
) -> InvocationState:
    """Where an attempt that failed (or lost its lease) leaves the invocation: pending
    again while its ``policy`` has attempts left and lets ``error``'s type be retried (and
    the error itself did not ask not to be), else failed."""
    error_type = error.get("type") if isinstance(error, dict) else None
    again = retry and attempts < policy.max_attempts
    return "pending" if again and policy.may_retry(error_type) else "failed"


@dataclass(frozen=True)
class Report:
    """One outcome a worker reports: a result, or an error (``retry``: may run again)."""

    invocation_id: str
    result: Any = None
    error: dict[str, Any] | None = None
    retry: bool = True
