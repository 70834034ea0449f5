"""Rate limits every replica shares: a token bucket per queue and per concurrency key,
kept in the store and taken from in the submit's own transaction.

The rule (how a bucket refills and what a take costs) is :class:`~lakeshore.domain.
admission.TokenBucket`'s; the store keeps each bucket's tokens and the instant they were
counted (``rate_buckets``, 0015). A take makes sure the bucket's row exists, locks it
(``FOR UPDATE``: two replicas' submits to one queue take from it one after the other,
which is what makes the limit hold across replicas on PostgreSQL; on SQLite the one
writer already does) and writes back what is left. A submit refused by any of its
buckets rolls its transaction back, every bucket's take with it. The instants are the
server's clock, which on PostgreSQL every replica corrects to the database's
(:mod:`.dbclock`), so replicas agree on how much has refilled.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncConnection

from lakeshore.domain.admission import TokenBucket
from lakeshore.store.tables import rate_buckets
from lakeshore.store.upsert import locked_row

QUEUE = ""  # the key of a queue's own bucket (a concurrency key is never empty)
_B = rate_buckets.c


async def take(
    conn: AsyncConnection, queue_id: str, key: str, rate: float, count: int, now: datetime
) -> float:
    """Take ``count`` tokens from the bucket (``queue_id``, ``key``) of ``rate`` a second
    at ``now``, in ``conn``'s transaction: 0.0 when granted, else the seconds until they
    would be (nothing is taken then)."""
    bucket = TokenBucket(rate=rate)
    row = await locked_row(
        conn,
        rate_buckets,
        {"queue_id": queue_id, "key": key},
        {"tokens": bucket.capacity, "updated_at": now},  # a new bucket is full
    )
    bucket.tokens = float(row.tokens)
    bucket.updated = row.updated_at.astimezone(UTC).timestamp()
    at = max(now.timestamp(), bucket.updated)  # a bucket is never counted backwards
    wait = bucket.take(count, at)
    if wait == 0.0:
        await conn.execute(
            update(rate_buckets)
            .where(_B.queue_id == queue_id, _B.key == key)
            .values(tokens=bucket.tokens, updated_at=datetime.fromtimestamp(at, UTC))
        )
    return wait
