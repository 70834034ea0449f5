"""Retry policies: how many attempts an invocation gets, how long it waits between them,
and which errors are worth another attempt.

A policy is written in three places, each field optional: on the queue (``retry:``), on
a function (``@udf(retry={...})``, sent with each of its submits) and on one submit
(``retry`` in the body; ``max_attempts`` as before). The **effective** policy takes each
field from the submit, else the function, else the queue, else :data:`DEFAULT`; it is
fixed at submit and stored on the invocation, so a later change to the queue does not
change what an invocation already waiting was promised.

- ``backoff``: ``exponential`` (``base_s`` · 2^(attempt-1), capped at ``max_s``) or
  ``fixed`` (``base_s`` every time).
- ``jitter`` (default on): *full jitter* — the wait is drawn uniformly between 0 and that
  bound, so a fleet that failed together does not retry together.
- ``never``: exception type names (``ValueError``, ``mymodule.BadInput`` as the daemon
  names it: the class's ``__name__``) that fail the invocation at once.
- ``only``: when given, the only type names that are retried.
Neither list applies to what the infrastructure reports (:data:`INFRASTRUCTURE`): a lease
lost to a daemon's crash is retried while attempts remain, whatever the lists say.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, model_validator

DEFAULT_MAX_ATTEMPTS: Final = 3
MAX_ATTEMPTS_LIMIT: Final = 100
MAX_WAIT_S: Final = 7 * 24 * 3600  # the longest wait between two attempts: a week
# what the daemon or the server reports about the infrastructure, not the user's code
INFRASTRUCTURE: Final = frozenset({"LeaseExpired", "WorkerCrash"})

Backoff = Literal["exponential", "fixed"]
TypeName = Annotated[StrictStr, Field(min_length=1, max_length=256)]
Wait = Annotated[float, Field(ge=0, le=MAX_WAIT_S)]


class RetrySpec(BaseModel):
    """A retry policy as written: every field optional (an unset one is inherited)."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False, frozen=True)

    max_attempts: Annotated[int, Field(strict=True, ge=1, le=MAX_ATTEMPTS_LIMIT)] | None = None
    backoff: Backoff | None = None
    base_s: Wait | None = None
    max_s: Wait | None = None
    jitter: StrictBool | None = None
    never: list[TypeName] | None = Field(default=None, max_length=64)
    only: list[TypeName] | None = Field(default=None, max_length=64)

    @model_validator(mode="after")
    def _cap_not_below_base(self) -> RetrySpec:
        if self.base_s is not None and self.max_s is not None and self.max_s < self.base_s:
            raise ValueError(f"max_s ({self.max_s}) must be at least base_s ({self.base_s})")
        return self

    def given(self) -> dict[str, Any]:
        """The fields this spec sets."""
        return self.model_dump(exclude_none=True)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """An effective policy: every field set."""

    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    backoff: Backoff = "exponential"
    base_s: float = 1.0
    max_s: float = 60.0
    jitter: bool = True
    never: tuple[str, ...] = ()
    only: tuple[str, ...] = ()

    def bound_s(self, attempts: int) -> float:
        """The longest wait after the ``attempts``-th attempt failed (the wait itself
        when there is no jitter)."""
        if self.backoff == "fixed":
            return self.base_s
        return float(min(self.max_s, self.base_s * 2 ** min(max(0, attempts - 1), 64)))

    def wait_s(self, attempts: int, draw: float) -> float:
        """The wait after the ``attempts``-th attempt failed; ``draw`` is uniform in
        [0, 1) (full jitter: ``draw`` times the bound)."""
        bound = self.bound_s(attempts)
        return bound * draw if self.jitter else bound

    def may_retry(self, error_type: str | None) -> bool:
        """Whether an error of ``error_type`` may be tried again (attempts permitting)."""
        if error_type is None or error_type in INFRASTRUCTURE:
            return True
        if error_type in self.never:
            return False
        return not self.only or error_type in self.only

    def to_json(self) -> dict[str, Any]:
        """The policy as an invocation stores and shows it."""
        return {
            "max_attempts": self.max_attempts,
            "backoff": self.backoff,
            "base_s": self.base_s,
            "max_s": self.max_s,
            "jitter": self.jitter,
            "never": list(self.never),
            "only": list(self.only),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> RetryPolicy:
        """A stored policy (``None``: one stored before policies were, the default with
        its ``max_attempts``)."""
        if not data:
            return DEFAULT
        return layered([data])


DEFAULT: Final = RetryPolicy()


def stored(policy: RetryPolicy) -> dict[str, Any] | None:
    """What an invocation stores of its policy beside its ``max_attempts`` column:
    nothing when the rest is the default (most submits)."""
    if policy is DEFAULT or _beside_attempts(policy) == _beside_attempts(DEFAULT):
        return None
    return policy.to_json()


def _beside_attempts(policy: RetryPolicy) -> tuple[Any, ...]:
    """Every field of ``policy`` but ``max_attempts`` (kept in a column of its own)."""
    return (policy.backoff, policy.base_s, policy.max_s, policy.jitter, policy.never, policy.only)


def shown(stored_policy: Mapping[str, Any] | None, max_attempts: int) -> dict[str, Any]:
    """An invocation's effective policy as its record shows it: one made once per
    ``max_attempts`` for the default (most rows: every claim answers with it), so a
    read of many rows builds none. Not to be changed by the caller."""
    if stored_policy is None:
        made = _SHOWN.get(max_attempts)
        if made is None:
            made = _SHOWN[max_attempts] = replace(DEFAULT, max_attempts=max_attempts).to_json()
        return made
    return policy_of(stored_policy, max_attempts).to_json()


_SHOWN: dict[int, dict[str, Any]] = {}


def policy_of(stored_policy: Mapping[str, Any] | None, max_attempts: int) -> RetryPolicy:
    """An invocation's effective policy from its row: its stored policy (None: the
    default) with its ``max_attempts`` column, which a retry by hand may have raised."""
    return replace(RetryPolicy.from_json(stored_policy), max_attempts=max_attempts)


def layered(specs: Iterable[Mapping[str, Any] | None]) -> RetryPolicy:
    """The effective policy of ``specs`` (each a :meth:`RetrySpec.given` or ``None``),
    the first that sets a field giving it, :data:`DEFAULT` the rest. A cap below the
    base (each level valid alone, not together) is raised to the base."""
    fields: dict[str, Any] = {}
    for spec in specs:
        for name, value in (spec or {}).items():
            fields.setdefault(name, value)
    merged = {name: fields.get(name, getattr(DEFAULT, name)) for name in _FIELDS}
    policy = RetryPolicy(
        **{**merged, "never": tuple(merged["never"]), "only": tuple(merged["only"])}
    )
    if policy.max_s < policy.base_s:
        return replace(policy, max_s=policy.base_s)
    return policy


_FIELDS: Final = tuple(RetrySpec.model_fields)
