"""The elasticity controller's tick: read every active queue's signals, decide, carry out at
most one launch or kill per queue or pool, and write exactly one audit row for each.

Reads and writes are batched (``lakeshore.store.controller``): a tick's query count does
not grow with the number of queues. Provider calls run concurrently, each bounded by a
time-out; a failure, a time-out or a missing victim turns the decision into a
``tick_noop`` with the reason appended, so a broken provider never wedges the loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from lakeshore.domain import custom_scaler, fleet, scaling
from lakeshore.domain.scaling import Counters, Decision, Signals
from lakeshore.services import scalers
from lakeshore.services.fleet_ops import FleetOps
from lakeshore.services.notify import Notifier
from lakeshore.services.units import (
    Outcome,
    Unit,
    gather_signals,
    provider_of,
    signals_json,
    units_of,
)
from lakeshore.store import controller as ctl_store
from lakeshore.store import launches as launch_store
from lakeshore.store.engine import Store

Clock = Callable[[], datetime]
DEFAULT_CALL_TIMEOUT_S = 10.0
DEFAULT_NOOP_RETENTION_S = 86_400.0  # a day of no-ops; decisions that acted are kept
PRUNE_EVERY = timedelta(minutes=1)
CONCURRENCY = 16
YIELD_EVERY = 500  # decisions between two turns of the event loop


class Controller:
    def __init__(
        self,
        store: Store,
        *,
        clock: Clock,
        server_url: str,
        node_id: str | None = None,
        call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
        allowed_scalers: Sequence[str] = (),
        noop_retention_s: float = DEFAULT_NOOP_RETENTION_S,
        notifier: Notifier | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.server_url = server_url
        self.node_id = node_id
        self.call_timeout_s = call_timeout_s
        self.scalers = scalers.Registry(allowed_scalers)
        self.noop_retention_s = noop_retention_s
        self.notifier = notifier or Notifier()
        self.ops = FleetOps(
            store,
            clock=clock,
            server_url=server_url,
            call_timeout_s=call_timeout_s,
            notifier=self.notifier,
        )
        self._lock = asyncio.Lock()
        self._pruned_at: datetime | None = None

    async def tick(self) -> list[dict[str, Any]]:
        """One tick over every active queue and pool; one outcome (and audit row) each."""
        async with self._lock:
            return [outcome.to_json() for outcome in await self._tick()]

    async def _tick(self) -> list[Outcome]:
        now = self.clock()
        async with self.store.write() as conn:
            expired = await launch_store.expire(conn, now)
        async with self.store.read() as conn:
            snap = await ctl_store.snapshot(conn, self.node_id)
            units = units_of(snap)
            in_flight = await launch_store.in_flight_by_scope(
                conn, [(u.namespace_id, u.scope) for u in units], now
            )
            wanted = {(u.namespace_id, p) for u in units if (p := provider_of(u)) is not None}
            wanted |= {(launch["namespace_id"], launch["provider_name"]) for launch in expired}
            registrations = await ctl_store.registrations(conn, wanted)
        decisions = []
        for n, unit in enumerate(units, 1):
            unit.signals = gather_signals(unit, snap, in_flight[(unit.namespace_id, unit.scope)])
            counters = snap.counters.get((unit.namespace_id, unit.scope), Counters())
            decisions.append(await self._decide(unit, unit.signals, counters))
            if n % YIELD_EVERY == 0:
                await asyncio.sleep(0)  # let the API's requests in between
        gate = asyncio.Semaphore(CONCURRENCY)

        async def carry_out(unit: Unit, decision: Decision) -> Outcome:
            async with gate:
                return await self._execute(unit, decision, registrations, now)

        async def stop_expired(launch: Any) -> None:
            async with gate:
                await self.ops.stop_expired(launch, registrations)

        outcomes: list[Outcome | None] = [
            None
            if d.action in ("scale_up", "scale_down")
            else Outcome(u, d, signals_json(u.signals))
            for u, d in zip(units, decisions, strict=True)
        ]  # only a launch or a kill has anything to await: a task each for those alone
        acting = [i for i, outcome in enumerate(outcomes) if outcome is None]
        done = await asyncio.gather(*(carry_out(units[i], decisions[i]) for i in acting))
        for i, outcome in zip(acting, done, strict=True):
            outcomes[i] = outcome
        await asyncio.gather(*(stop_expired(launch) for launch in expired))
        final = [outcome for outcome in outcomes if outcome is not None]
        await self._record(final, snap.counters, now)
        await self._prune(now)
        return final

    async def _prune(self, now: datetime) -> None:
        """Drop no-op events past their retention, at most once a minute."""
        if self._pruned_at is not None and now - self._pruned_at < PRUNE_EVERY:
            return
        self._pruned_at = now
        async with self.store.write() as conn:
            await ctl_store.prune_noops(conn, now - timedelta(seconds=self.noop_retention_s))

    async def _decide(self, unit: Unit, s: Signals, counters: Counters) -> Decision:
        queue = unit.policy_queue
        policy = scaling.Policy.from_elasticity(queue.spec.elasticity)
        path = queue.spec.custom_scaler_udf
        if path is None:
            return scaling.decide(policy, s, counters)
        try:
            answer = await self.scalers.call(path, s, timeout_s=self.call_timeout_s)
        except scalers.ScalerError as exc:
            return custom_scaler.scaler_failed(str(exc))
        return custom_scaler.interpret_scaler_answer(answer, policy, s)

    async def _execute(
        self,
        unit: Unit,
        decision: Decision,
        registrations: dict[tuple[str, str], Any],
        now: datetime,
    ) -> Outcome:
        before = signals_json(unit.signals)
        if decision.action == "scale_up":
            return await self._launch(unit, decision, registrations, now)
        if decision.action == "scale_down":
            return await self._kill(unit, decision, registrations, now)
        return Outcome(unit, decision, before)

    # --- scale-up and scale-down -------------------------------------------------------

    async def _launch(
        self,
        unit: Unit,
        decision: Decision,
        registrations: dict[tuple[str, str], Any],
        now: datetime,
    ) -> Outcome:
        before = signals_json(unit.signals)
        name = provider_of(unit)
        if name is None:
            failure = scaling.no_provider_reason(unit.launch_from.name)
            return Outcome(unit, scaling.downgrade(decision, failure), before)
        launched = await self.ops.launch(
            namespace_id=unit.namespace_id,
            namespace=unit.namespace,
            scope=unit.scope,
            provider_name=name,
            registration=registrations.get((unit.namespace_id, name)),
            template=unit.launch_from.spec.daemon_template,
            membership=unit.membership,
        )
        detail = {"provider": name}
        if launched.launch_id is not None:
            detail["launch_id"] = launched.launch_id
        if launched.failure is not None:
            return Outcome(unit, scaling.downgrade(decision, launched.failure), before, detail)
        after = {**before, "in_flight": before["in_flight"] + 1}
        return Outcome(unit, decision, after, detail)

    async def _kill(
        self,
        unit: Unit,
        decision: Decision,
        registrations: dict[tuple[str, str], Any],
        now: datetime,
    ) -> Outcome:
        before = signals_json(unit.signals)
        victim = fleet.pick_victim(unit.workers)
        if victim is None:
            none_idle = "no idle worker to kill (busy workers are never killed)"
            return Outcome(unit, scaling.downgrade(decision, none_idle), before)
        detail: dict[str, Any] = {"victim": victim.id}
        retired = await self.ops.retire(
            namespace_id=unit.namespace_id,
            worker_id=victim.id,
            reason=decision.reason,
            registrations=registrations,
        )
        if retired.failure is not None:
            return Outcome(unit, scaling.downgrade(decision, retired.failure), before, detail)
        if retired.status != "retired":
            not_idle = f"worker {victim.id} is {retired.status}; not killed"
            return Outcome(unit, scaling.downgrade(decision, not_idle), before, detail)
        after = {**before, "daemon_count": before["daemon_count"] - 1}
        return Outcome(unit, decision, after, detail)

    # --- the audit rows and counters ---------------------------------------------------

    async def _record(
        self,
        outcomes: Sequence[Outcome],
        old: dict[tuple[str, str], Counters],
        now: datetime,
    ) -> None:
        rows = []
        changed: dict[tuple[str, str], Counters] = {}
        for outcome in outcomes:
            unit, decision = outcome.unit, outcome.decision
            key = (unit.namespace_id, unit.scope)
            if old.get(key, Counters()) != decision.counters:
                changed[key] = decision.counters
            rows.append(
                {
                    "namespace_id": unit.namespace_id,
                    "queue_name": unit.scope,
                    "action": decision.action,
                    "reason": decision.reason,
                    "before": signals_json(unit.signals),
                    "after": outcome.after,
                    "signals": {
                        "rule": decision.rule,
                        "target": decision.target,
                        "blocked_by": decision.blocked_by,
                        "hint": decision.hint,
                        "counters": {
                            "above": decision.counters.above,
                            "below": decision.counters.below,
                        },
                        **outcome.detail,
                    },
                    "created_at": now,
                }
            )
        async with self.store.write() as conn:
            await ctl_store.write_events(conn, rows)
            await ctl_store.save_counters(conn, changed, now)
