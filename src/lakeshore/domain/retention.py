"""Retention: how long a finished invocation, and a decision event, is kept.

A finished invocation (succeeded, failed, cancelled, expired) and its stream items are
deleted once it finished longer ago than its queue's ``retention_s``, else the server's
``LAKESHORE_RETENTION_S``. Once its row is gone its idempotency ``key`` is free again: the
window in which a repeated key returns the earlier invocation is the retention window.
A decision event counts from its last tick (``last_at`` of a folded no-op, else when it was
written), and goes after ``LAKESHORE_EVENT_RETENTION_S``; no-ops sooner, after
``elasticity_noop_retention_s`` when that is shorter.

Deleting is done in batches of at most :data:`BATCH_ROWS` rows, each its own short
transaction followed by a pause four times as long as it took, so a claim or a submit never waits
on a long delete, nor on a train of short ones. The rules here are pure
(``now`` is given); ``lakeshore.services.taskqueue.retention`` runs them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

FINISHED_STATES: Final = ("succeeded", "failed", "cancelled", "expired")
DEFAULT_RETENTION_S: Final = 7 * 24 * 3600.0
DEFAULT_EVENT_RETENTION_S: Final = 7 * 24 * 3600.0
MAX_RETENTION_S: Final = 10 * 365 * 24 * 3600  # ten years: the dates stay within 1-9999
BATCH_ROWS: Final = 1_000  # rows deleted per transaction
MAX_BATCHES: Final = 1_000  # per kind and sweep: a sweep ends, and the next one goes on
# after each batch the sweep waits this many times as long as the batch took: on SQLite
# (one writer) back-to-back batches held the writer lock most of the time, and a drain
# running meanwhile went at half its speed (bench/retention.py); at four times the
# sweep holds the store at most a fifth of the time, and still deleted some 7,000
# invocations a second on either store (docs/benchmarks.md), 600 million a day
PAUSE_SHARE: Final = 4.0
MAX_PAUSE_S: Final = 2.0
# the leader adds up each queue's finished invocations (for ``stats``) up to this long
# ago, so that a finish stamped before that moment has committed when it is counted
TALLY_LAG_S: Final = 30.0


def tally_until(now: datetime) -> datetime:
    """Up to when the leader adds finished invocations to their queues' tallies."""
    return now - timedelta(seconds=TALLY_LAG_S)


def cutoff(now: datetime, retention_s: float) -> datetime:
    """What finished (or was last decided) before this is past its retention."""
    return now - timedelta(seconds=retention_s)


def queue_cutoffs(
    now: datetime, queue_retention: Mapping[str, float | None], default_s: float
) -> dict[str, datetime]:
    """Each queue's cutoff: its own ``retention_s`` when it has one, else the server's."""
    return {
        queue_id: cutoff(now, default_s if own is None else own)
        for queue_id, own in queue_retention.items()
    }


def event_cutoffs(now: datetime, event_s: float, noop_s: float) -> tuple[datetime, datetime]:
    """(every event, no-ops): no-ops go at the sooner of their own window and the events'."""
    return cutoff(now, event_s), cutoff(now, min(event_s, noop_s))


def more_batches(
    last_deleted: int,
    batches_done: int,
    *,
    batch_rows: int = BATCH_ROWS,
    max_batches: int = MAX_BATCHES,
) -> bool:
    """Whether to delete another batch: a batch that came back short found all there was;
    a full one may have left rows behind, up to ``max_batches`` a sweep (the next sweep
    goes on, so one sweep never holds the loop for long)."""
    return last_deleted >= batch_rows and batches_done < max_batches


def pause_after(batch_s: float, share: float = PAUSE_SHARE) -> float:
    """How long to wait after a batch that took ``batch_s`` before the next one."""
    return min(MAX_PAUSE_S, max(0.0, batch_s) * share)


@dataclass(frozen=True)
class Deleted:
    """What one sweep deleted, by kind (the ``kind`` label of the metric)."""

    invocations: int = 0
    stream_items: int = 0
    events: int = 0

    def as_counts(self) -> dict[str, int]:
        return {
            "invocations": self.invocations,
            "stream_items": self.stream_items,
            "events": self.events,
        }
