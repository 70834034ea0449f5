"""Periodic schedules: what a schedule may say, and which of its slots are due.

A schedule belongs to a queue and submits ``fn(*args, **kwargs)`` there at each of its
slots. Its slots come from a ``cron`` expression (5 fields, or 6 with seconds first,
computed by croniter in the schedule's IANA ``timezone``, so DST is the zone's own) or a
fixed interval ``every_s`` (the instants that are whole multiples of ``every_s`` since
1970-01-01T00:00Z, so ``every_s: 3600`` fires on the hour whoever created it).

Everything here is pure: ``now`` and the last slot enqueued are given. The leader asks
:func:`due` which slots to enqueue; a slot is *missed* when it is later than
:data:`ON_TIME_S` by the time a leader looks, and ``catch_up`` says what becomes of
missed slots: ``none`` skips them, ``one`` enqueues only the latest, ``all`` enqueues
every one, oldest first, at most :data:`MAX_SLOTS_PER_TICK` a tick (the rest the next).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Final, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter  # type: ignore[import-untyped]
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, ValidationError

from lakeshore.domain import jsonsafe
from lakeshore.domain.invocations import is_import_path
from lakeshore.domain.names import NAME_RULE, is_valid_name
from lakeshore.domain.validation import invalid_input
from lakeshore.errors import InvalidInput

CatchUp = Literal["none", "one", "all"]
CATCH_UPS: Final = ("none", "one", "all")
MIN_EVERY_S: Final = 1.0
MAX_EVERY_S: Final = 366 * 24 * 3600.0
MAX_SLOTS_PER_TICK: Final = 100  # catch_up "all": the rest are enqueued on the next tick
ON_TIME_S: Final = 30.0  # a slot found due later than this was missed
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_US: Final = timedelta(microseconds=1)


class _Body(BaseModel):
    """A schedule as a client writes it (every field; PATCH merges onto the stored one)."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False, frozen=True)

    name: Annotated[StrictStr, Field(max_length=63)]
    cron: Annotated[StrictStr, Field(min_length=1, max_length=256)] | None = None
    every_s: Annotated[float, Field(ge=MIN_EVERY_S, le=MAX_EVERY_S)] | None = None
    fn: Annotated[StrictStr, Field(max_length=512)]
    args: list[Any] = Field(default_factory=list)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    timezone: Annotated[StrictStr, Field(min_length=1, max_length=64)] = "UTC"
    catch_up: CatchUp = "one"
    enabled: StrictBool = True


@dataclass(frozen=True)
class ScheduleSpec:
    """A valid schedule's definition."""

    name: str
    fn: str
    cron: str | None = None
    every_s: float | None = None
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] | None = None
    timezone: str = "UTC"
    catch_up: CatchUp = "one"
    enabled: bool = True

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "cron": self.cron,
            "every_s": self.every_s,
            "fn": self.fn,
            "args": list(self.args),
            "kwargs": dict(self.kwargs or {}),
            "timezone": self.timezone,
            "catch_up": self.catch_up,
            "enabled": self.enabled,
        }


EDITABLE: Final = frozenset(_Body.model_fields) - {"name"}


def json_schema(*, patch: bool = False) -> dict[str, Any]:
    """The JSON schema of a schedule as a create takes it (``patch``: of a change)."""
    schema = _Body.model_json_schema()
    schema["title"] = "SchedulePatch" if patch else "Schedule"
    schema["description"] = (
        "The fields to change (each replaces the stored one)"
        if patch
        else "A periodic schedule: exactly one of cron and every_s"
    )
    if patch:
        del schema["properties"]["name"]
        schema.pop("required", None)
    return schema


def parse(data: Any) -> ScheduleSpec:
    """Validate a whole schedule; :class:`InvalidInput` names the field."""
    if not isinstance(data, dict):
        raise InvalidInput("a schedule is a JSON object with `name`, `fn` and `cron` or `every_s`")
    jsonsafe.require_storable(data, "")
    try:
        body = _Body.model_validate(data)
    except ValidationError as exc:
        raise invalid_input(exc) from exc
    if not is_valid_name(body.name):
        raise InvalidInput(
            f"{body.name!r} is not a valid schedule name: use {NAME_RULE}", field="name"
        )
    if not is_import_path(body.fn):
        raise InvalidInput(
            f'{body.fn!r} is not an import path of the form "package.module:function"', field="fn"
        )
    if (body.cron is None) == (body.every_s is None):
        raise InvalidInput("a schedule has exactly one of `cron` and `every_s`", field="cron")
    zone(body.timezone)
    if body.cron is not None:
        check_cron(body.cron)
    return ScheduleSpec(
        name=body.name,
        fn=body.fn,
        cron=body.cron,
        every_s=body.every_s,
        args=tuple(body.args),
        kwargs=dict(body.kwargs),
        timezone=body.timezone,
        catch_up=body.catch_up,
        enabled=body.enabled,
    )


def patched(spec: ScheduleSpec, changes: Any) -> ScheduleSpec:
    """``spec`` with ``changes`` (a JSON object of fields) applied, validated whole. Giving
    ``cron`` drops ``every_s`` and the other way round, unless both are given."""
    if not isinstance(changes, dict):
        raise InvalidInput("a schedule change is a JSON object of the fields to change")
    unknown = sorted(set(changes) - EDITABLE)
    if unknown:
        raise InvalidInput(f"{unknown[0]}: cannot be changed", field=unknown[0])
    merged = spec.to_json()
    if "cron" in changes and "every_s" not in changes:
        merged["every_s"] = None
    if "every_s" in changes and "cron" not in changes:
        merged["cron"] = None
    merged.update(changes)
    return parse({k: v for k, v in merged.items() if v is not None})


@functools.lru_cache(maxsize=256)
def zone(name: str) -> ZoneInfo:
    """The IANA zone ``name``; :class:`InvalidInput` when there is none."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise InvalidInput(
            f"{name!r} is not an IANA time zone (such as UTC or Europe/Paris)", field="timezone"
        ) from exc


def _seconds_first(expr: str) -> bool:
    return len(expr.split()) == 6


def check_cron(expr: str) -> None:
    """A 5-field cron expression, or 6 with seconds first; :class:`InvalidInput` else."""
    fields = len(expr.split())
    if fields not in (5, 6):
        raise InvalidInput(
            f"{expr!r}: a cron expression has 5 fields (minute hour day month weekday), or 6 "
            "with seconds first",
            field="cron",
        )
    try:
        croniter(expr, _EPOCH, second_at_beginning=fields == 6).get_next(datetime)
    except (ValueError, TypeError, KeyError, IndexError, OverflowError) as exc:
        raise InvalidInput(f"{expr!r} is not a valid cron expression: {exc}", field="cron") from exc


def _utc(moment: datetime) -> datetime:
    return moment.astimezone(UTC)


def _cron(spec: ScheduleSpec, start: datetime, *, backwards: bool = False) -> Any:
    assert spec.cron is not None
    local = start.astimezone(zone(spec.timezone))
    return croniter(
        spec.cron, local, is_prev=backwards, second_at_beginning=_seconds_first(spec.cron)
    )


def _every_us(spec: ScheduleSpec) -> int:
    assert spec.every_s is not None
    return max(1, round(spec.every_s * 1_000_000))


def _since_epoch_us(moment: datetime) -> int:
    return (moment - _EPOCH) // _US


def next_slot(spec: ScheduleSpec, after: datetime) -> datetime:
    """The first slot strictly after ``after`` (UTC)."""
    if spec.every_s is not None:
        step = _every_us(spec)
        k = _since_epoch_us(after) // step + 1
        return _EPOCH + timedelta(microseconds=k * step)
    return _utc(_cron(spec, after).get_next(datetime))


def latest_slot(spec: ScheduleSpec, at: datetime) -> datetime:
    """The last slot at or before ``at`` (UTC)."""
    if spec.every_s is not None:
        step = _every_us(spec)
        return _EPOCH + timedelta(microseconds=_since_epoch_us(at) // step * step)
    # cron slots fall on whole seconds: the last one before the next whole second
    ceiling = at.replace(microsecond=0) + timedelta(seconds=1)
    return _utc(_cron(spec, ceiling, backwards=True).get_prev(datetime))


@dataclass(frozen=True)
class Due:
    """What a leader does with a schedule now: enqueue ``slots`` (oldest first), then
    record ``last`` as the last slot dealt with (enqueued or skipped)."""

    slots: tuple[datetime, ...]
    last: datetime
    skipped: int = 0


def due(
    spec: ScheduleSpec, after: datetime, now: datetime, *, limit: int = MAX_SLOTS_PER_TICK
) -> Due:
    """The slots to enqueue at ``now``, ``after`` being the last slot dealt with (or the
    schedule's creation). A paused schedule has none, and skips what falls due while it
    is paused (its ``last`` moves on), so resuming it does not replay the pause."""
    latest = latest_slot(spec, now)
    if latest <= after:
        return Due((), after)
    if not spec.enabled:
        return Due((), latest)
    if spec.catch_up != "all":
        on_time = (now - latest).total_seconds() <= ON_TIME_S
        if spec.catch_up == "one" or on_time:
            return Due((latest,), latest)
        return Due((), latest, skipped=1)
    slots: list[datetime] = []
    cursor = after
    while len(slots) < limit:
        cursor = next_slot(spec, cursor)
        if cursor > latest:
            break
        slots.append(cursor)
    return Due(tuple(slots), slots[-1])


def upcoming(spec: ScheduleSpec, after: datetime, now: datetime) -> datetime | None:
    """The next slot a leader will enqueue (``None`` while paused): the oldest one still
    owed with ``catch_up: all``, else the first after ``now``."""
    if not spec.enabled:
        return None
    if spec.catch_up == "all":
        return next_slot(spec, after)
    return next_slot(spec, max(after, now))


def slot_text(slot: datetime) -> str:
    """A slot as RFC 3339 in UTC, seconds or finer: ``2026-12-07T13:00:00Z``."""
    return _utc(slot).isoformat().replace("+00:00", "Z")


def slot_key(name: str, slot: datetime) -> str:
    """The idempotency key of a schedule's slot: one invocation per slot, whoever submits
    it and however often."""
    return f"schedule:{name}:{slot_text(slot)}"


def with_enabled(spec: ScheduleSpec, enabled: bool) -> ScheduleSpec:
    return replace(spec, enabled=enabled)
