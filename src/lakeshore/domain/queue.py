"""The Queue record: what a user may write, and the rules it must obey.

Over HTTP and in ``lakeshore.yaml`` the top level is camelCase and nested objects are
snake_case, exactly as the reference pages spell them. Validation goes beyond the
reference on purpose: counts are integers, ranges hold (``0 <= min <= max``,
``0 < threshold_low < threshold <= 1``), and each refusal names its field. Elasticity
kinds are accepted only underscored; a hyphenated spelling is refused with the spelling
to use (the CLI converts it before sending). Unknown keys inside ``elasticity`` are kept
and ignored, so newer clients can write fields an older server does not act on yet.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from lakeshore.domain import access, jsonsafe
from lakeshore.domain.kinds import (
    ELASTICITY_KINDS,
    QueueKind,
    normalize_elasticity_kind,
)
from lakeshore.domain.names import Name
from lakeshore.domain.retention import MAX_RETENTION_S
from lakeshore.domain.retry import RetrySpec
from lakeshore.domain.states import QueueState
from lakeshore.domain.validation import invalid_input
from lakeshore.errors import InvalidInput

OnFull = Literal["reject", "block"]

DEFAULT_THRESHOLD: Final = 0.8
DEFAULT_THRESHOLD_LOW: Final = 0.3
READ_ONLY_FIELDS: Final = ("id", "namespaceId", "state", "createdAt", "updatedAt")

_IMPORT_PATH_RE = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
_STRICT = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False, frozen=True)


def _check_elasticity_kind(value: str) -> str:
    if value in ELASTICITY_KINDS:
        return value
    underscored = normalize_elasticity_kind(value)
    if "-" in value and underscored in ELASTICITY_KINDS:
        raise ValueError(
            f'"{value}" is the CLI spelling; the API and lakeshore.yaml take the underscored '
            f'form "{underscored}"'
        )
    raise ValueError(
        f'unknown kind "{jsonsafe.printable(value)}"; expected one of {", ".join(ELASTICITY_KINDS)}'
    )


def _check_storable(value: Any) -> Any:
    problem = jsonsafe.find_unstorable(value)
    if problem is not None:
        where = f"{jsonsafe.printable(problem.path)}: " if problem.path else ""
        raise ValueError(f"{where}{problem.reason}")
    return value


MIN_RATE: Final = 1e-6  # a submit in 11.6 days


def _slowest_rate(value: float) -> float:
    # nearer 0, a refused submit's wait (its Retry-After) outgrows any clock, up to infinity;
    # a range error (not a ValueError) carries its bound, as Field(ge=…) would
    if value < MIN_RATE:
        raise PydanticCustomError(
            "greater_than_equal",
            "a rate_limit is at least {ge} submits a second",
            {"ge": MIN_RATE},
        )
    return value


def _check_import_path(value: str) -> str:
    if not _IMPORT_PATH_RE.fullmatch(value):
        raise ValueError(f'{value!r} is not an import path of the form "package.module:function"')
    return value


# Every number has a range the stores and the date arithmetic hold: counts fit an INTEGER
# column, and a duration subtracted from (or added to) now stays within years 1-9999
MAX_COUNT: Final = 2**31 - 1
MAX_DURATION_S: Final = 10 * 365 * 24 * 3600  # ten years: 315,360,000 s
Count = Annotated[int, Field(strict=True, ge=0, le=MAX_COUNT)]
Duration = Annotated[float, Field(gt=0, le=MAX_DURATION_S)]
Fraction = Annotated[float, Field(gt=0, le=1)]
Text = Annotated[StrictStr, Field(max_length=1024)]
Label = Annotated[StrictStr, Field(min_length=1, max_length=256)]
Script = Annotated[StrictStr, Field(max_length=65536)]
FreeJson = Annotated[Any, AfterValidator(_check_storable)]


class KindParams(BaseModel):
    model_config = _STRICT

    temperature: Annotated[float, Field(gt=0, le=1e9)] | None = None
    priority_field: Annotated[StrictStr, Field(min_length=1, max_length=128)] | None = None


class Admission(BaseModel):
    model_config = _STRICT

    max_depth: Annotated[int, Field(strict=True, ge=1, le=MAX_COUNT)] | None = None
    on_full: OnFull | None = None
    rate_limit: Annotated[float, Field(gt=0, le=1e9), AfterValidator(_slowest_rate)] | None = None
    # submits a second per concurrency key (a submit without a key is not limited by it)
    rate_limit_per_key: (
        Annotated[float, Field(gt=0, le=1e9), AfterValidator(_slowest_rate)] | None
    ) = None
    deadline_cutoff_s: Duration | None = None
    # at most this many of the queue's invocations leased at once across the fleet
    # (prefetched included), and at most this many per concurrency key
    max_running: Annotated[int, Field(strict=True, ge=1, le=MAX_COUNT)] | None = None
    max_running_per_key: Annotated[int, Field(strict=True, ge=1, le=MAX_COUNT)] | None = None


class Match(BaseModel):
    model_config = _STRICT

    tags: list[Label] = Field(default_factory=list, max_length=256)
    runners: list[Label] = Field(default_factory=list, max_length=256)


class Elasticity(BaseModel):
    """The launch policy. Unknown keys are kept (forward compatibility) and ignored."""

    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False, frozen=True)

    kind: Annotated[StrictStr, AfterValidator(_check_elasticity_kind)]
    min: Count | None = None
    max: Count | None = None
    threshold: Fraction | None = None
    threshold_low: Annotated[float, Field(gt=0, lt=1)] | None = Field(
        default=None, validate_default=True
    )
    pool: Name | None = None
    match: Match | None = None
    steal_delay_s: Annotated[float, Field(ge=0, le=MAX_DURATION_S)] | None = None
    # launches (or kills) one tick may make for the scope: 1 by default, the spec's rule
    # (wait_target: no limit below max)
    max_step: Annotated[int, Field(strict=True, ge=1, le=MAX_COUNT)] | None = None
    # wait_target: the p95 submit → start wait to keep under, and hints of the service
    # and boot times for before the scope has a history of its own
    wait_s: Duration | None = None
    service_s: Duration | None = None
    boot_s: Duration | None = None

    @field_validator("max")
    @classmethod
    def _max_not_below_min(cls, value: int | None, info: ValidationInfo) -> int | None:
        low = info.data.get("min")
        if value is not None and low is not None and value < low:
            raise ValueError(f"max ({value}) must be at least min ({low})")
        return value

    @field_validator("threshold_low")
    @classmethod
    def _low_below_high(cls, value: float | None, info: ValidationInfo) -> float | None:
        high = info.data.get("threshold")
        if value is not None and high is not None and value >= high:
            raise ValueError(f"threshold_low ({value}) must be below threshold ({high})")
        if info.data.get("kind") == "pool_with_threshold":
            eff_high = DEFAULT_THRESHOLD if high is None else high
            eff_low = DEFAULT_THRESHOLD_LOW if value is None else value
            if eff_low >= eff_high:
                low_note = "" if value is not None else ", the default"
                high_note = "" if high is not None else ", the default"
                raise ValueError(
                    f"threshold_low ({eff_low}{low_note}) must be below "
                    f"threshold ({eff_high}{high_note})"
                )
        return value

    @model_validator(mode="after")
    def _extras_are_json(self) -> Elasticity:
        _check_storable(self.model_extra or {})
        return self

    @model_validator(mode="after")
    def _wait_target_has_its_wait(self) -> Elasticity:
        if self.kind == "wait_target" and self.wait_s is None:
            raise ValueError("wait_target needs wait_s: the p95 submit → start wait to keep under")
        return self

    @property
    def high(self) -> float:
        return DEFAULT_THRESHOLD if self.threshold is None else self.threshold

    @property
    def low(self) -> float:
        return DEFAULT_THRESHOLD_LOW if self.threshold_low is None else self.threshold_low


class DaemonTemplate(BaseModel):
    model_config = ConfigDict(
        strict=True,
        extra="forbid",
        allow_inf_nan=False,
        frozen=True,
        validate_by_alias=True,
        validate_by_name=False,
        serialize_by_alias=True,
    )

    instance_type: Label | None = None
    image_id: Annotated[StrictStr, Field(min_length=1, max_length=1024)] | None = None
    runner: Label | None = None
    runners: list[Label] | None = Field(default=None, max_length=64)
    capacity: Annotated[int, Field(strict=True, ge=1, le=100_000)] | None = None
    cloud_tags: dict[Label, Annotated[StrictStr, Field(max_length=256)]] | None = Field(
        default=None, alias="cloudTags", max_length=64
    )
    bootstrap_script: Script | None = None
    setup_scripts: list[Script] | None = Field(default=None, max_length=64)
    provider: Name | None = None


class QueueSpec(BaseModel):
    """Every field of a queue that a user writes (create takes it; PATCH replaces parts)."""

    model_config = ConfigDict(
        strict=True,
        extra="forbid",
        allow_inf_nan=False,
        frozen=True,
        alias_generator=to_camel,
        validate_by_alias=True,
        validate_by_name=False,
        serialize_by_alias=True,
    )

    name: Name
    description: Text | None = None
    kind: QueueKind = "fifo"
    kind_params: KindParams | None = None
    admission: Admission | None = None
    reserved_slots: Count | None = None
    auth_policy: FreeJson = None
    provider_ref: Name | None = None
    elasticity: Elasticity | None = None
    daemon_template: DaemonTemplate | None = None
    custom_scaler_udf: Annotated[StrictStr, AfterValidator(_check_import_path)] | None = None
    server_node_id: Annotated[StrictStr, Field(min_length=1, max_length=128)] | None = None
    # spelled as the setting it overrides (LAKESHORE_RETENTION_S), not ``retentionS``
    retention_s: Annotated[float, Field(gt=0, le=MAX_RETENTION_S)] | None = Field(
        default=None, alias="retention_s"
    )
    # the queue's retry policy (each field optional): under a function's and a submit's
    retry: RetrySpec | None = None

    def to_json(self) -> dict[str, Any]:
        """The record as the API and the store spell it (camelCase, unset fields omitted)."""
        return self.model_dump(mode="json", exclude_none=True)


class Queue(BaseModel):
    """A stored queue: its spec plus what the server owns."""

    model_config = ConfigDict(frozen=True)

    id: str
    namespace_id: str
    spec: QueueSpec
    state: QueueState
    created_at: datetime
    updated_at: datetime

    @property
    def name(self) -> str:
        return self.spec.name

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "namespaceId": self.namespace_id,
            **self.spec.to_json(),
            "state": self.state,
            "createdAt": self.created_at.isoformat(),
            "updatedAt": self.updated_at.isoformat(),
        }


def parse_spec(data: Any) -> QueueSpec:
    """Validate a queue as written by a user; :class:`InvalidInput` names the first bad field."""
    if not isinstance(data, dict):
        raise InvalidInput("a queue is a JSON object of its fields")
    jsonsafe.require_storable(data)
    for key in READ_ONLY_FIELDS:
        if key in data:
            hint = "; change it with drain, pause, resume, archive or unarchive"
            raise InvalidInput(
                f"{key} is set by the server{hint if key == 'state' else ''}", field=key
            )
    try:
        spec = QueueSpec.model_validate(data)
    except ValidationError as exc:
        raise invalid_input(exc) from exc
    if spec.auth_policy is not None:
        access.parse(spec.auth_policy)  # its shape: InvalidInput naming the bad field
    return spec


def merge_patch(spec: QueueSpec, patch: Any) -> QueueSpec:
    """Apply a PATCH body: each key present replaces that field whole; null clears it."""
    if not isinstance(patch, dict):
        raise InvalidInput("a PATCH body is a JSON object of the fields to replace")
    if "name" in patch and patch["name"] != spec.name:
        raise InvalidInput("a queue cannot be renamed", field="name")
    merged = spec.to_json()
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return parse_spec(merged)
