"""Retry policies, pure: the effective policy of three layers, the waits, and which
errors are retried."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from lakeshore.domain.retry import DEFAULT, RetryPolicy, RetrySpec, layered


@pytest.mark.parametrize(
    ("submit", "function", "queue", "expected"),
    [
        (None, None, None, DEFAULT),
        ({"max_attempts": 5}, None, None, RetryPolicy(max_attempts=5)),
        # each field from the highest layer that sets it
        (
            {"max_attempts": 2},
            {"max_attempts": 9, "never": ["ValueError"]},
            {"backoff": "fixed", "base_s": 5.0, "never": ["KeyError"]},
            RetryPolicy(max_attempts=2, backoff="fixed", base_s=5.0, never=("ValueError",)),
        ),
        (
            None,
            None,
            {"jitter": False, "only": ["IOError"]},
            RetryPolicy(jitter=False, only=("IOError",)),
        ),
        # a base above the default cap raises the cap with it
        (None, {"base_s": 120.0}, None, RetryPolicy(base_s=120.0, max_s=120.0)),
        # a cap on one layer below a base on another: the cap is raised to the base
        ({"max_s": 2.0}, None, {"base_s": 10.0}, RetryPolicy(base_s=10.0, max_s=10.0)),
    ],
)
def test_the_effective_policy_takes_each_field_from_the_highest_layer(
    submit: dict[str, Any] | None,
    function: dict[str, Any] | None,
    queue: dict[str, Any] | None,
    expected: RetryPolicy,
) -> None:
    assert layered([submit, function, queue]) == expected


@pytest.mark.parametrize(
    ("policy", "attempts", "draw", "wait"),
    [
        (RetryPolicy(jitter=False), 1, 0.5, 1.0),
        (RetryPolicy(jitter=False), 3, 0.5, 4.0),
        (RetryPolicy(jitter=False), 30, 0.5, 60.0),  # capped at max_s
        (RetryPolicy(jitter=False), 10_000, 0.5, 60.0),  # no overflow however many
        (RetryPolicy(), 3, 0.0, 0.0),  # full jitter: anywhere in [0, bound)
        (RetryPolicy(), 3, 0.25, 1.0),
        (RetryPolicy(), 3, 0.999, 3.996),
        (RetryPolicy(backoff="fixed", base_s=7.0, jitter=False), 9, 0.5, 7.0),
        (RetryPolicy(backoff="fixed", base_s=8.0), 9, 0.5, 4.0),
        (RetryPolicy(base_s=0.0, jitter=False), 4, 0.5, 0.0),  # at once
    ],
)
def test_waits_grow_to_their_cap_and_full_jitter_draws_below_the_bound(
    policy: RetryPolicy, attempts: int, draw: float, wait: float
) -> None:
    assert policy.wait_s(attempts, draw) == pytest.approx(wait)


@pytest.mark.parametrize(
    ("attempts", "bound"),
    [(0, 1.0), (1, 1.0), (2, 2.0), (3, 4.0), (6, 32.0), (7, 60.0), (100, 60.0)],
)
def test_the_default_bound_doubles_from_one_second_up_to_a_minute(
    attempts: int, bound: float
) -> None:
    assert DEFAULT.bound_s(attempts) == bound


@pytest.mark.parametrize(
    ("policy", "error_type", "retried"),
    [
        (DEFAULT, "ValueError", True),
        (DEFAULT, None, True),
        (RetryPolicy(never=("ValueError",)), "ValueError", False),
        (RetryPolicy(never=("ValueError",)), "KeyError", True),
        (RetryPolicy(only=("IOError",)), "IOError", True),
        (RetryPolicy(only=("IOError",)), "ValueError", False),
        (RetryPolicy(only=("IOError",), never=("IOError",)), "IOError", False),  # never first
        # the infrastructure's reports are retried whatever the lists say
        (RetryPolicy(only=("IOError",)), "LeaseExpired", True),
        (RetryPolicy(never=("WorkerCrash",)), "WorkerCrash", True),
    ],
)
def test_never_and_only_choose_which_errors_are_retried(
    policy: RetryPolicy, error_type: str | None, retried: bool
) -> None:
    assert policy.may_retry(error_type) is retried


def test_a_policy_round_trips_through_its_stored_form() -> None:
    policy = RetryPolicy(max_attempts=4, backoff="fixed", base_s=2.5, never=("A", "B"))
    assert RetryPolicy.from_json(policy.to_json()) == policy
    assert RetryPolicy.from_json(None) == DEFAULT


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"max_attempts": 0}, "greater than or equal to 1"),
        ({"max_attempts": 101}, "less than or equal to 100"),
        ({"backoff": "linear"}, "exponential"),
        ({"base_s": -1.0}, "greater than or equal to 0"),
        ({"base_s": 10.0, "max_s": 5.0}, "max_s (5.0) must be at least base_s (10.0)"),
        ({"jitter": "yes"}, "boolean"),
        ({"never": "ValueError"}, "list"),
        ({"never": [""]}, "at least 1 character"),
        ({"retry_on": ["X"]}, "Extra inputs"),
        ({"base_s": float("inf")}, "finite"),
    ],
)
def test_a_bad_spec_is_refused_with_what_is_wrong(body: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        RetrySpec.model_validate(body)


def test_a_spec_gives_only_what_it_sets() -> None:
    assert RetrySpec.model_validate({"never": ["ValueError"], "jitter": False}).given() == {
        "never": ["ValueError"],
        "jitter": False,
    }
