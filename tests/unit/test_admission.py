from __future__ import annotations

import pytest

from lakeshore.domain.admission import TokenBucket, has_room


@pytest.mark.parametrize(
    ("pending", "incoming", "max_depth", "expected"),
    [
        (0, 1, None, True),
        (9, 1, 10, True),
        (10, 1, 10, False),
        (5, 6, 10, False),
        (0, 10, 10, True),
    ],
)
def test_depth(pending: int, incoming: int, max_depth: int | None, expected: bool) -> None:
    assert has_room(pending=pending, incoming=incoming, max_depth=max_depth) is expected


def test_a_bucket_grants_a_burst_then_paces() -> None:
    bucket = TokenBucket(rate=2.0)
    assert bucket.take(1, now=100.0) == 0.0
    assert bucket.take(1, now=100.0) == 0.0
    assert bucket.take(1, now=100.0) == pytest.approx(0.5)  # refused: wait half a second
    assert bucket.take(1, now=100.5) == 0.0
    assert bucket.take(1, now=100.5) == pytest.approx(0.5)


def test_a_bucket_refills_only_to_its_capacity() -> None:
    bucket = TokenBucket(rate=1.0)
    bucket.take(1, now=0.0)
    assert bucket.take(1, now=1000.0) == 0.0
    assert bucket.take(1, now=1000.0) == pytest.approx(1.0)


def test_a_batch_larger_than_a_burst_waits_for_a_full_bucket() -> None:
    bucket = TokenBucket(rate=2.0)
    assert bucket.take(1, now=0.0) == 0.0
    assert bucket.take(5, now=0.0) == pytest.approx(0.5)
    assert bucket.take(5, now=0.5) == 0.0


def test_an_oversized_batch_admitted_at_a_full_bucket_empties_it() -> None:
    bucket = TokenBucket(rate=2.0)
    assert bucket.take(5, now=0.0) == 0.0  # full at first use: the batch goes through
    assert bucket.take(1, now=0.0) == pytest.approx(0.5)  # and the next submit waits
    assert bucket.take(1, now=0.5) == 0.0


def test_an_oversized_batch_waits_until_the_bucket_is_full() -> None:
    bucket = TokenBucket(rate=4.0)
    assert bucket.take(4, now=0.0) == 0.0
    assert bucket.take(9, now=0.25) == pytest.approx(0.75)  # 1 of 4 tokens back: 3 to go
    assert bucket.take(9, now=1.0) == 0.0


@pytest.mark.parametrize(
    ("rate", "count", "now", "retry_after"),
    [
        (2.0, 2, 0.25, 0.75),  # 0.5 tokens back, 1.5 missing at 2 a second
        (2.0, 1, 0.25, 0.25),
        (0.5, 1, 1.0, 1.0),  # a slow rate: a burst of one, half of it back
        (4.0, 4, 0.5, 0.5),  # a batch the size of a burst waits for the missing tokens only
    ],
)
def test_retry_after_is_the_time_until_the_missing_tokens_are_back(
    rate: float, count: int, now: float, retry_after: float
) -> None:
    bucket = TokenBucket(rate=rate)
    assert bucket.take(int(bucket.capacity), now=0.0) == 0.0  # empty it
    assert bucket.take(count, now=now) == pytest.approx(retry_after)
