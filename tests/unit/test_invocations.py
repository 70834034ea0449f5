"""What a submit may carry, where a failed attempt leaves an invocation, and retry timing."""

from __future__ import annotations

from typing import Any

import pytest

from lakeshore.domain.invocations import (
    InvocationState,
    Submit,
    after_failure,
    parse_submit,
    parse_submits,
    priority_of,
    retry_policy,
)
from lakeshore.domain.retry import RetryPolicy, RetrySpec
from lakeshore.errors import InvalidInput


def test_a_submit_takes_the_defaults_for_what_it_leaves_out() -> None:
    assert parse_submit({"fn": "pkg.mod:fn"}) == Submit(
        fn="pkg.mod:fn", args=[], kwargs={}, key=None, max_attempts=3, timeout_s=None
    )


def test_a_submit_keeps_everything_it_carries() -> None:
    body = {
        "fn": "pkg.mod:Cls.method",
        "args": [1, "two"],
        "kwargs": {"priority": 5},
        "key": "k-1",
        "max_attempts": 7,
        "timeout_s": 2.5,
        "delay_s": 30.0,
        "not_before": None,  # one or the other
        "retry": {
            "max_attempts": None,
            "backoff": "fixed",
            "base_s": 2.0,
            "max_s": None,
            "jitter": False,
            "never": ["ValueError"],
            "only": None,
        },
        "concurrency_key": "customer-9",
    }
    assert parse_submit(body).model_dump() == body


@pytest.mark.parametrize(
    ("body", "queue_retry", "expected"),
    [
        ({}, None, RetryPolicy()),
        ({"max_attempts": 3}, None, RetryPolicy()),  # given, and the default
        ({"max_attempts": 5}, RetrySpec(max_attempts=2), RetryPolicy(max_attempts=5)),
        ({}, RetrySpec(max_attempts=2, jitter=False), RetryPolicy(max_attempts=2, jitter=False)),
        # max_attempts given beside retry wins over retry's
        (
            {"max_attempts": 4, "retry": {"max_attempts": 9, "never": ["KeyError"]}},
            RetrySpec(backoff="fixed"),
            RetryPolicy(max_attempts=4, never=("KeyError",), backoff="fixed"),
        ),
        ({"retry": {"only": ["IOError"]}}, None, RetryPolicy(only=("IOError",))),
    ],
)
def test_a_submit_s_retry_policy_is_its_own_over_its_queue_s(
    body: dict[str, Any], queue_retry: RetrySpec | None, expected: RetryPolicy
) -> None:
    assert retry_policy(parse_submit({"fn": "pkg:fn", **body}), queue_retry) == expected


# (body, where, field, exact message)
REFUSED_SUBMITS = [
    pytest.param(
        ["pkg:fn"], "", None, "an invocation is a JSON object with at least `fn`",
        id="not an object",
    ),
    pytest.param(
        "pkg:fn", "invocations[3]", "invocations[3]",
        "an invocation is a JSON object with at least `fn`", id="not an object, in a batch",
    ),
    pytest.param(
        {"fn": "pkg:fn", "args": ["ok", "a\x00b"]}, "", "args[1]",
        "args[1]: text may not contain NUL characters", id="NUL in args",
    ),
    pytest.param(
        {"fn": "pkg:fn", "kwargs": {"x": "\x00"}}, "invocations[2]", "invocations[2].kwargs.x",
        "invocations[2].kwargs.x: text may not contain NUL characters", id="NUL in a batch",
    ),
    pytest.param(
        {"fn": "os.system"}, "", "fn",
        "fn: 'os.system' is not an import path of the form \"package.module:function\"",
        id="fn not an import path",
    ),
    pytest.param(
        {"fn": "pkg:fn", "max_attempts": 0}, "invocations[1]", "invocations[1].max_attempts",
        "invocations[1].max_attempts: Input should be greater than or equal to 1",
        id="a refusal in a batch names its place",
    ),
    pytest.param(
        {"fn": "pkg:fn", "timeout_s": "5"}, "", "timeout_s",
        "timeout_s: Input should be a valid number", id="numeric string for timeout_s",
    ),
    pytest.param(
        {"fn": "pkg:fn", "max_attempts": "3"}, "", "max_attempts",
        "max_attempts: Input should be a valid integer", id="numeric string for max_attempts",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("body", "where", "field", "message"), REFUSED_SUBMITS)
def test_a_refused_submit_names_its_field_under_where(
    body: Any, where: str, field: str | None, message: str
) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_submit(body, where=where)
    assert (caught.value.field, caught.value.message) == (field, message)


def _nested(depth: int) -> list[Any]:
    value: list[Any] = [1]
    for _ in range(depth - 1):
        value = [value]
    return value


# bodies the quick look at a submit (every name known, fn an import path) lets through
# to the full check, which refuses them as it always did
NEARLY_PLAIN = [
    ({"fn": "pkg:fn", "timeout_s": float("nan")}, "timeout_s", "NaN and infinite numbers"),
    ({"fn": "pkg:fn", "key": "a\x00"}, "key", "text may not contain NUL"),
    ({"fn": "pkg:fn", "kwargs": {"a": {"b\ud800": 1}}}, "kwargs.a.b\\ud800", "lone surrogate"),
    ({"fn": "pkg:fn\x00"}, "fn", "text may not contain NUL"),
    ({"fn": "pkg:fn", "extra": "\x00"}, "extra", "text may not contain NUL"),
    ({"fn": "pkg:fn", "args": _nested(32)}, "args", "nested deeper than 32 levels"),
    ({"fn": "pkg:fn", "max_attempts": True}, "max_attempts", "valid integer"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "field", "reason"), NEARLY_PLAIN)
def test_a_nearly_plain_submit_is_refused_by_the_full_check(
    body: dict[str, Any], field: str, reason: str
) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_submit(body)
    assert caught.value.field is not None and caught.value.field.startswith(field)
    assert reason in caught.value.message


@pytest.mark.parametrize(
    "body",
    [
        {"fn": "pkg:fn"},
        {"fn": "pkg.mod:Cls.fn", "args": [1, "x", None, [2.5]], "kwargs": {"a": {"b": []}}},
        {"fn": "pkg:fn", "key": "k", "max_attempts": 100, "timeout_s": 5},
        {"fn": "pkg:fn", "args": [], "kwargs": {}, "key": None, "timeout_s": None},
    ],
)
def test_a_plain_submit_parses_as_the_model_validates_it(body: dict[str, Any]) -> None:
    assert parse_submit(body) == Submit.model_validate(body)


PLAIN_BATCH = [
    {"fn": "pkg:fn"},
    {"fn": "pkg.mod:Cls.fn", "args": [1, "x", None, [2.5]], "kwargs": {"a": {"b": []}}},
    {"fn": "pkg:fn", "key": "k", "max_attempts": 100, "timeout_s": 5},
]
PLACES = [f"invocations[{i}]" for i in range(4)]


def test_a_batch_parses_as_its_submits_one_by_one() -> None:
    parsed = parse_submits(PLAIN_BATCH, PLACES[:3])
    assert parsed == [parse_submit(body) for body in PLAIN_BATCH]
    assert all(type(submit) is Submit for submit in parsed)


@pytest.mark.parametrize(("body", "where", "field", "message"), REFUSED_SUBMITS)
def test_a_batch_refuses_a_bad_submit_as_it_alone_is_refused(
    body: Any, where: str, field: str | None, message: str
) -> None:
    # plain (one model call for the batch) or not, the refusal names the body's place
    with pytest.raises(InvalidInput) as alone:
        parse_submit(body, where="invocations[3]")
    with pytest.raises(InvalidInput) as caught:
        parse_submits([*PLAIN_BATCH, body], PLACES)
    assert (caught.value.field, caught.value.message) == (alone.value.field, alone.value.message)


def test_a_batch_refuses_its_first_bad_submit() -> None:
    bodies = [{"fn": "pkg:fn"}, {"fn": "pkg:fn", "key": ""}, {"fn": "pkg:fn\x00"}, {"fn": 1}]
    with pytest.raises(InvalidInput) as caught:
        parse_submits(bodies, PLACES)
    assert caught.value.field == "invocations[1].key"


def test_a_refusal_outside_a_batch_names_the_field_alone() -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_submit({"fn": "pkg:fn", "key": ""})
    assert caught.value.field == "key"
    assert caught.value.message == "key: String should have at least 1 character"


@pytest.mark.parametrize(
    ("kwargs", "field", "priority"),
    [
        ({"priority": 5}, None, 5.0),  # the default field
        ({"priority": -2.5}, None, -2.5),
        ({"urgency": 2, "priority": 9}, "urgency", 2.0),  # the queue's own field
        ({"priority": 9}, "urgency", 0.0),  # the default is not read when a field is named
        ({}, None, 0.0),
        ({"priority": True}, None, 0.0),  # a bool is not a number here
        ({"priority": "5"}, None, 0.0),
        ({"priority": None}, None, 0.0),
        ({"priority": float("inf")}, None, 0.0),
        ({"priority": float("nan")}, None, 0.0),
    ],
)
def test_priority_is_a_finite_number_or_zero(
    kwargs: dict[str, Any], field: str | None, priority: float
) -> None:
    assert priority_of(kwargs, field) == priority


@pytest.mark.parametrize(
    ("attempts", "policy", "retry", "error_type", "state"),
    [
        (1, RetryPolicy(), True, "ValueError", "pending"),
        (2, RetryPolicy(), True, "ValueError", "pending"),
        (3, RetryPolicy(), True, "ValueError", "failed"),  # the last attempt is spent
        (4, RetryPolicy(), True, "ValueError", "failed"),
        (1, RetryPolicy(), False, "ValueError", "failed"),  # an error that asks not to retry
        (1, RetryPolicy(never=("ValueError",)), True, "ValueError", "failed"),
        (1, RetryPolicy(only=("IOError",)), True, "ValueError", "failed"),
        (1, RetryPolicy(only=("IOError",)), True, "LeaseExpired", "pending"),
        (4, RetryPolicy(max_attempts=5), True, "ValueError", "pending"),
    ],
)
def test_a_failed_attempt_goes_back_to_pending_while_its_policy_allows(
    attempts: int, policy: RetryPolicy, retry: bool, error_type: str, state: InvocationState
) -> None:
    error = {"type": error_type, "message": "m"}
    assert after_failure(attempts, policy, retry=retry, error=error) == state
