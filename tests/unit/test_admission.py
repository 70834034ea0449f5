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
