"""The per-address count of wrong tokens: a leaky bucket, on a clock the test gives."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import cast

import pytest

from lakeshore.errors import TooManyRequests, Unauthorized
from lakeshore.services.auth import ADMIN_SEEN_S, THROTTLED, Callers
from lakeshore.services.throttle import BURST, FailureThrottle, address_key
from lakeshore.store.engine import Store


def test_a_burst_is_counted_then_the_next_failure_waits_for_the_bucket_to_drain() -> None:
    throttle = FailureThrottle(burst=3, refill_s=10.0)
    assert [throttle.failed("a", 100.0) for _ in range(3)] == [None, None, None]
    assert throttle.failed("a", 100.0) == pytest.approx(10.0)
    assert throttle.failed("a", 104.0) == pytest.approx(6.0)
    assert throttle.wait("a", 104.0) == pytest.approx(6.0)


def test_a_refused_failure_adds_nothing_so_one_is_counted_every_refill() -> None:
    throttle = FailureThrottle(burst=2, refill_s=5.0)
    for _ in range(2):
        throttle.failed("a", 0.0)
    for _ in range(50):
        assert throttle.failed("a", 1.0) is not None
    assert throttle.failed("a", 5.0) is None  # one drained: counted
    assert throttle.failed("a", 5.0) == pytest.approx(5.0)


def test_addresses_are_counted_apart() -> None:
    throttle = FailureThrottle(burst=1, refill_s=5.0)
    assert throttle.failed("a", 0.0) is None
    assert throttle.failed("a", 0.0) is not None
    assert throttle.wait("b", 0.0) is None
    assert throttle.failed("b", 0.0) is None


def test_an_address_is_forgotten_once_its_bucket_is_empty() -> None:
    throttle = FailureThrottle(burst=2, refill_s=5.0, max_addresses=10)
    throttle.failed("a", 0.0)
    throttle.failed("a", 0.0)
    assert len(throttle._buckets) == 1
    throttle.failed("b", 10.0)  # a's bucket is empty by then
    assert list(throttle._buckets) == ["b"]


def test_the_map_holds_at_most_max_addresses() -> None:
    throttle = FailureThrottle(burst=2, refill_s=5.0, max_addresses=100)
    for n in range(1_000):
        throttle.failed(f"10.0.{n // 256}.{n % 256}", 0.0)
    assert len(throttle._buckets) == 100


@pytest.mark.parametrize(
    ("host", "key"),
    [
        ("203.0.113.7", "203.0.113.7"),
        ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:ffff::1", "2001:db8:1:2::/64"),
        ("::ffff:203.0.113.7", "203.0.113.7"),
        ("fe80::1%eth0", "fe80::/64"),
        ("testclient", "testclient"),
        ("not:an:address", "not:an:address"),
    ],
)
def test_an_address_counts_as_itself_or_its_ipv6_slash_64(host: str, key: str) -> None:
    assert address_key(host) == key


def test_the_throttled_addresses_are_forgotten_as_they_run_out() -> None:
    throttle = FailureThrottle(burst=1, refill_s=5.0)
    throttle.failed("a", 0.0)
    throttle.failed("b", 1.0)
    assert throttle.throttling()
    assert throttle.wait("b", 5.5) == pytest.approx(0.5)
    assert throttle.wait("b", 6.0) is None
    assert not throttle.throttling()


def test_the_throttled_addresses_are_bounded_too() -> None:
    throttle = FailureThrottle(burst=1, refill_s=5.0, max_addresses=10)
    for n in range(100):
        throttle.failed(f"10.0.0.{n}", 0.0)
    assert len(throttle._full) == 10
    assert throttle.wait("10.0.0.99", 0.0) is not None


ADMIN_TOKEN = "an-admin-token-of-the-operators"
HERE = ("203.0.113.7", 40000)


async def test_a_throttled_address_keeps_the_admin_token_an_hour_after_its_last_use() -> None:
    ticks = [0.0]
    callers = Callers(
        cast(Store, None),  # neither the admin token nor a malformed one reads the store
        ADMIN_TOKEN,
        timer=lambda: ticks[0],
        clock=lambda: datetime(2026, 1, 1, tzinfo=UTC),
    )
    assert (await callers.authenticate(ADMIN_TOKEN, HERE)).is_admin
    for _ in range(BURST):
        with pytest.raises(Unauthorized):
            await callers.authenticate("wrong", HERE)
    with pytest.raises(TooManyRequests):
        await callers.authenticate("wrong", HERE)

    ticks[0] = ADMIN_SEEN_S - 1
    assert (await callers.authenticate(ADMIN_TOKEN, HERE)).is_admin  # and seen again now
    ticks[0] = 2 * ADMIN_SEEN_S - 2
    assert (await callers.authenticate(ADMIN_TOKEN, HERE)).is_admin
    ticks[0] = 3 * ADMIN_SEEN_S
    with pytest.raises(TooManyRequests) as refused:
        await callers.authenticate(ADMIN_TOKEN, HERE)
    assert refused.value.message == THROTTLED  # as a wrong token's
    # elsewhere, and without an address, it is the admin's
    assert (await callers.authenticate(ADMIN_TOKEN, ("192.0.2.1", 1))).is_admin
    assert (await callers.authenticate(ADMIN_TOKEN)).is_admin
    assert callers.throttled(HERE)
    assert not callers.throttled(("192.0.2.1", 1))
    assert not callers.throttled(None)
