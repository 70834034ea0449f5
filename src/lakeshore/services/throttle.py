"""Failed sign-ins and wrong tokens, counted per client address.

Each address has a leaky bucket of :data:`BURST` failures that drains one every
:data:`REFILL_S` seconds: a burst of mistakes is answered 401 as always, then, while the
bucket is full, a wrong token is answered 429 with the wait until another failure would
be counted (``Retry-After``). A refused attempt adds nothing, so an address that keeps
failing gets one counted failure every :data:`REFILL_S` seconds, however fast it sends.

The address is the one the server sees (the ASGI scope's client, which uvicorn rewrites
from ``X-Forwarded-For`` for the hops ``LAKESHORE_FORWARDED_ALLOW_IPS`` trusts); an IPv6
address counts with the rest of its /64, which one host or network usually holds whole.
The buckets live in a bounded map that forgets an address once its bucket is empty, so a
flood from many addresses costs at most :data:`ADDRESSES_MAX` entries. The counts are a
replica's own: behind a load balancer an address gets a burst from each replica.

What a full bucket means for a valid token is decided in
:class:`lakeshore.services.auth.Callers`; this module only counts.
"""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass

from cachetools import TTLCache

from lakeshore import logs

BURST = 10  # failures an address may make at once before it is throttled
REFILL_S = 6.0  # then one more every this long (10 a minute)
ADDRESSES_MAX = 100_000  # addresses counted at once, the least recently failing dropped first
log = logging.getLogger("lakeshore.auth")


def address_key(host: str) -> str:
    """What an address is counted as: itself (IPv4, or a name), or its /64 (IPv6)."""
    if ":" not in host:
        return host
    try:
        address = ipaddress.IPv6Address(host.split("%", 1)[0])
    except ValueError:
        return host
    if address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(ipaddress.IPv6Network((address, 64), strict=False))


@dataclass(frozen=True)
class Bucket:
    level: float  # failures counted and not yet drained
    at: float  # when ``level`` was taken (seconds)
    told: bool = False  # the log said this address is throttled

    def drained(self, now: float, refill_s: float) -> float:
        return max(0.0, self.level - max(0.0, now - self.at) / refill_s)


def wait_s(level: float, burst: int, refill_s: float) -> float | None:
    """How long until a failure would be counted again, with ``level`` drained to now;
    ``None`` when one would be counted now."""
    over = level + 1 - burst
    return over * refill_s if over > 0 else None


class FailureThrottle:
    """The buckets of one replica. Times are seconds on any one clock (``now``).

    The addresses whose bucket is full are also kept apart, with when it has room again,
    so that asking about an address (every request, where a valid admin token or the
    fast submit door must know) costs a look in an empty dict while none is."""

    def __init__(
        self,
        *,
        burst: int = BURST,
        refill_s: float = REFILL_S,
        max_addresses: int = ADDRESSES_MAX,
    ) -> None:
        self.burst, self.refill_s, self.max_addresses = burst, refill_s, max_addresses
        self._now = 0.0  # the ``now`` of the latest failure: the map's own clock
        self._buckets: TTLCache[str, Bucket] = TTLCache(
            max_addresses, burst * refill_s, timer=lambda: self._now
        )
        self._full: dict[str, float] = {}  # address -> when its bucket has room again

    def throttling(self) -> bool:
        """Whether any address may be throttled now."""
        return bool(self._full)

    def wait(self, key: str, now: float) -> float | None:
        """How long ``key`` must wait before a failure of its is counted again; ``None``
        when it is not throttled."""
        self._forget_run_out(now)
        until = self._full.get(key)
        return None if until is None or until <= now else until - now

    def failed(self, key: str, now: float) -> float | None:
        """Count a failure of ``key``: ``None`` when it is counted (answer it 401), else
        the wait until one would be (answer it 429 with this ``Retry-After``)."""
        waiting = self.wait(key, now)
        if waiting is not None:
            return waiting
        self._now = max(self._now, now)
        bucket = self._buckets.get(key)
        level = (bucket.drained(now, self.refill_s) if bucket is not None else 0.0) + 1
        told = bucket is not None and bucket.told and level > 1
        full_for = wait_s(level, self.burst, self.refill_s)
        if full_for is not None:
            self._fill(key, now, now + full_for)
            if not told:  # once a spell, not once every refill
                log.warning(
                    "%d failed tokens or sign-ins from %s: its wrong tokens are answered "
                    "429 until one every %.0f s",
                    self.burst,
                    key,
                    self.refill_s,
                    extra=logs.ids(action="throttle"),
                )
                told = True
        self._buckets[key] = Bucket(level, now, told)
        return None

    def _fill(self, key: str, now: float, until: float) -> None:
        self._full.pop(key, None)  # kept in the order they run out (about: waits differ)
        self._full[key] = until
        while len(self._full) > self.max_addresses:  # the first to run out go first
            del self._full[next(iter(self._full))]

    def _forget_run_out(self, now: float) -> None:
        while self._full:
            first = next(iter(self._full))
            if self._full[first] > now:
                return
            del self._full[first]
