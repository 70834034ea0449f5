"""Prometheus metrics: what this server did (its own counters and histograms) and what the
store holds (gauges read at a scrape).

Two kinds, so that a sum over replicas is right (docs/observability.md):

* **This replica's** — HTTP requests, controller ticks and decisions: each replica
  counts what it served or ran, so summing over replicas gives the cluster's.
* **The store's** — per queue pending, running, oldest pending age, daemons, capacity,
  utilization, launches in flight, hysteresis counters: the same numbers on every
  replica, so only one exports them. On SQLite that is the server; on PostgreSQL the
  replica that leads the elasticity ticks of the unpinned queues (or, with the loop off,
  any that is asked).
  ``lakeshore_store_gauges_exported`` is 1 on the replica that exports them.

The store is read at most once per :data:`READ_EVERY_S` however many scrapers ask, in
five grouped queries whatever the number of queues. Labels are bounded: namespace and
queue names, route templates, actions and rules — never an invocation or worker id.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from cachetools import LRUCache
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy.ext.asyncio import AsyncConnection

from lakeshore.store import gauges as gauge_store
from lakeshore.store.engine import Store

READ_EVERY_S = 1.0
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
NAMES_KEPT = 100_000
# an invocation's new state → the outcome counted (``pending``: failed, to run again)
OUTCOME_OF = {
    "succeeded": "succeeded",
    "pending": "retried",
    "failed": "failed",
    "expired": "expired",
    "cancelled": "cancelled",
}
_TICK_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class Metrics:
    """One server's metrics (one per application, so two servers in one process — tests —
    count apart)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.http_requests = Counter(
            "lakeshore_http_requests",
            "HTTP requests this replica answered, by route template and status.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.http_seconds = Histogram(
            "lakeshore_http_request_duration_seconds",
            "Time to answer an HTTP request (a claim's long-poll wait included).",
            ["method", "route"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.tick_seconds = Histogram(
            "lakeshore_tick_duration_seconds",
            "Duration of this replica's elasticity ticks.",
            buckets=_TICK_BUCKETS,
            registry=self.registry,
        )
        self.decisions = Counter(
            "lakeshore_decisions",
            "Elasticity decisions this replica recorded, by action and rule.",
            ["action", "rule"],
            registry=self.registry,
        )
        self.fleet_calls = Counter(
            "lakeshore_fleet_calls",
            "Launches and kills this replica's controller carried out, by provider and "
            "outcome (ok: the daemon was asked for or stopped; failed: the decision was "
            "downgraded to a no-op with the reason).",
            ["provider", "call", "outcome"],
            registry=self.registry,
        )
        queue_labels = ["namespace", "queue"]
        self.submitted = Counter(
            "lakeshore_invocations_submitted",
            "Invocations this replica created (a submit that found its key taken: none).",
            queue_labels,
            registry=self.registry,
        )
        self.outcomes = Counter(
            "lakeshore_invocation_outcomes",
            "Invocations or attempts that ended through this replica: succeeded, retried "
            "(failed, to run again after its backoff), failed (for good), expired (not "
            "started within the queue's deadline_cutoff_s) or cancelled.",
            [*queue_labels, "outcome"],
            registry=self.registry,
        )
        self.leases_expired = Counter(
            "lakeshore_leases_expired",
            "Leases this replica's reaper took back from a worker that stopped renewing "
            "them (each begun attempt then counted retried or failed; one that never "
            "began goes back to the queue uncharged).",
            queue_labels,
            registry=self.registry,
        )
        self.wait_seconds = Histogram(
            "lakeshore_invocation_wait_seconds",
            "From submit to the first attempt's start, for the invocations this replica leased.",
            queue_labels,
            buckets=_WAIT_BUCKETS,
            registry=self.registry,
        )
        self.run_seconds = Histogram(
            "lakeshore_invocation_run_seconds",
            "From an attempt's start to its outcome, for the outcomes this replica recorded.",
            queue_labels,
            buckets=_WAIT_BUCKETS,
            registry=self.registry,
        )
        self.retention_deleted = Counter(
            "lakeshore_retention_deleted",
            "Rows this replica's retention sweep deleted past their window, by kind: "
            "invocations, stream_items, events.",
            ["kind"],
            registry=self.registry,
        )
        for kind in ("invocations", "stream_items", "events"):
            self.retention_deleted.labels(kind)  # shown at 0 before the first deletion
        # names for the labels, looked up once per queue or namespace (names never change)
        self._queue_names: LRUCache[str, tuple[str, str]] = LRUCache(NAMES_KEPT)
        self._namespace_names: LRUCache[str, str] = LRUCache(NAMES_KEPT)
        self._read_at: datetime | None = None
        self._reading: list[gauge_store.QueueGauges] = []
        self._read_lock = asyncio.Lock()

    def count_decisions(self, outcomes: Iterable[dict[str, object]]) -> None:
        """A tick's (or a nudge's) decisions, as the controller returns them."""
        for outcome in outcomes:
            action, rule = str(outcome.get("action")), str(outcome.get("rule") or "")
            self.decisions.labels(action, rule).inc()

    def count_retention(
        self, *, invocations: int = 0, stream_items: int = 0, events: int = 0
    ) -> None:
        """Rows a retention batch deleted."""
        for kind, n in (
            ("invocations", invocations),
            ("stream_items", stream_items),
            ("events", events),
        ):
            if n:
                self.retention_deleted.labels(kind).inc(n)

    # --- invocations ---------------------------------------------------------------------

    async def queue_names(
        self, conn: AsyncConnection, queue_ids: Iterable[str]
    ) -> dict[str, tuple[str, str]]:
        """Queue id → (namespace, queue) labels, read in ``conn`` for ids not seen yet."""
        wanted = set(queue_ids)
        missing = [q for q in wanted if q not in self._queue_names]
        if missing:
            self._queue_names.update(await gauge_store.queue_names(conn, missing))
        return {q: self._queue_names[q] for q in wanted if q in self._queue_names}

    async def namespace_name(self, store: Store, namespace_id: str) -> str | None:
        name = self._namespace_names.get(namespace_id)
        if name is None:
            async with store.read() as conn:
                name = await gauge_store.namespace_name(conn, namespace_id)
            if name is not None:
                self._namespace_names[namespace_id] = name
        return name

    def leased(self, namespace: str, invocations: Iterable[dict[str, Any]]) -> None:
        """Invocations a claim returned (their JSON): the first attempts' wait. Each
        queue's series is looked up once a call (a claim returns hundreds at a time)."""
        series: dict[str, Any] = {}
        for inv in invocations:
            if inv.get("attempts") == 1 and inv.get("started_at") and inv.get("created_at"):
                waited = _at(inv["started_at"]) - _at(inv["created_at"])
                queue = inv["queue"]
                if queue not in series:
                    series[queue] = self.wait_seconds.labels(namespace, queue)
                series[queue].observe(max(0.0, waited.total_seconds()))

    def ended(
        self, labels: tuple[str, str], state: str, started_at: datetime | None, now: datetime
    ) -> None:
        """An attempt's outcome, recorded: ``state`` is the invocation's new one."""
        self.ended_many([(labels, state, started_at)], now)

    def ended_many(
        self, ended: Iterable[tuple[tuple[str, str], str, datetime | None]], now: datetime
    ) -> None:
        """Many attempts' outcomes (labels, new state, started at), as a report of a
        hundred brings them: each series is looked up and each count added once."""
        counts: dict[tuple[str, str, str], int] = {}
        runs: dict[tuple[str, str], Any] = {}
        for labels, state, started_at in ended:
            outcome = OUTCOME_OF.get(state)
            if outcome is None:
                continue
            key = (*labels, outcome)
            counts[key] = counts.get(key, 0) + 1
            if started_at is not None:
                if labels not in runs:
                    runs[labels] = self.run_seconds.labels(*labels)
                runs[labels].observe(max(0.0, (now - started_at).total_seconds()))
        for key, n in counts.items():
            self.outcomes.labels(*key).inc(n)

    async def count_by_queue(
        self,
        store: Store,
        outcomes: Mapping[tuple[str, str], int],
        leases_expired: Mapping[str, int] | None = None,
    ) -> None:
        """Outcomes recorded in bulk, (queue id, outcome) → how many, and leases taken back,
        queue id → how many (the reaper's sweep, a bulk cancel): one read for the names."""
        leases_expired = leases_expired or {}
        wanted = {queue_id for queue_id, _ in outcomes} | set(leases_expired)
        if not wanted:
            return
        async with store.read() as conn:
            names = await self.queue_names(conn, wanted)
        for (queue_id, outcome), n in outcomes.items():
            if queue_id in names and n > 0:
                self.outcomes.labels(*names[queue_id], outcome).inc(n)
        for queue_id, n in leases_expired.items():
            if queue_id in names and n > 0:
                self.leases_expired.labels(*names[queue_id]).inc(n)

    async def render(self, store: Store, now: datetime, *, export_store: bool) -> bytes:
        """The exposition text: this replica's metrics, and the store's when it exports
        them."""
        reading = await self._read(store, now) if export_store else []
        store_part = CollectorRegistry(auto_describe=False)
        store_part.register(_StoreGauges(reading, now, export_store))
        return generate_latest(self.registry) + generate_latest(store_part)

    async def _read(self, store: Store, now: datetime) -> list[gauge_store.QueueGauges]:
        async with self._read_lock:  # scrapers at once share one read
            fresh = (
                self._read_at is not None
                and 0 <= (now - self._read_at).total_seconds() < READ_EVERY_S
            )
            if not fresh:
                async with store.read() as conn:
                    self._reading = await gauge_store.read(conn, now)
                self._read_at = now
            return self._reading


class _StoreGauges(Collector):
    def __init__(
        self, reading: Sequence[gauge_store.QueueGauges], now: datetime, exported: bool
    ) -> None:
        self.reading, self.now, self.exported = reading, now, exported

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "lakeshore_store_gauges_exported",
            "1 on the replica that exports the store's per-queue gauges, else 0.",
            value=1 if self.exported else 0,
        )
        if not self.exported:
            return
        labels = ["namespace", "queue"]
        families = {
            name: GaugeMetricFamily(f"lakeshore_queue_{name}", words, labels=labels)
            for name, words in (
                ("pending", "Invocations waiting to be claimed (a retry's backoff included)."),
                ("scheduled", "Delayed submits not due yet (not counted in pending)."),
                ("running", "Invocations leased to a worker."),
                ("oldest_pending_age_seconds", "Age of the oldest pending invocation (0: none)."),
                ("daemons", "Workers subscribed to the queue (retiring ones left out)."),
                ("capacity", "Those workers' max_invocations, summed."),
                ("utilization", "running / capacity (0 with no capacity)."),
                ("launches_in_flight", "Launches asked of a provider, not yet said hello."),
                (
                    "consecutive_above",
                    "pool_with_threshold's consecutiveAbove: ticks in a row with utilization "
                    "at or above the high watermark (a pooled queue's: its pool's).",
                ),
                (
                    "consecutive_below",
                    "pool_with_threshold's consecutiveBelow: ticks in a row with utilization "
                    "at or below the low watermark (a pooled queue's: its pool's).",
                ),
            )
        }
        for g in self.reading:
            key = [g.namespace, g.queue]
            age = 0.0
            if g.oldest_pending_at is not None:
                age = max(0.0, (self.now - g.oldest_pending_at).total_seconds())
            values = {
                "pending": g.pending,
                "scheduled": g.scheduled,
                "running": g.running,
                "oldest_pending_age_seconds": age,
                "daemons": g.daemons,
                "capacity": g.capacity,
                "utilization": g.running / g.capacity if g.capacity else 0.0,
                "launches_in_flight": g.launches_in_flight,
                "consecutive_above": g.consecutive_above,
                "consecutive_below": g.consecutive_below,
            }
            for name, value in values.items():
                families[name].add_metric(key, value)
        yield from families.values()


def _at(value: str) -> datetime:
    return datetime.fromisoformat(value)
