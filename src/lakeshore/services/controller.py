"""The elasticity controller's tick: read every active queue's signals, decide, carry out at
most one launch or kill per queue or pool, and write exactly one audit row for each.

Reads and writes are batched (``lakeshore.store.controller``): a tick's query count does
not grow with the number of queues. Provider calls run concurrently, each bounded by a
time-out; a failure, a time-out or a missing victim turns the decision into a
``tick_noop`` with the reason appended, so a broken provider never wedges the loop. The
loop waits for provider calls only until its interval is nearly spent: a call still
running then ends in the background and writes its audit row itself, so the next tick
starts on time (its launch is already recorded in flight, its victim already retiring,
so the next tick neither launches twice nor picks the same victim).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, Final

from sqlalchemy import RowMapping

from lakeshore.domain import custom_scaler, fleet, scaling
from lakeshore.domain.scaling import Counters, Decision, Signals
from lakeshore.services import scalers
from lakeshore.services.fleet_ops import FleetOps, Launched, LaunchSpec, Prepared, Retired
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
from lakeshore.store.leadership import Led

log = logging.getLogger("lakeshore.controller")

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
        # queue id → the scope it ticks in, for scopes the last full tick left at zero
        # (no daemon, nothing in flight, nothing pending, a target policy): a submit to
        # one of these queues is planned at once (see :meth:`nudge`)
        self.at_zero: dict[str, tuple[str, str]] = {}
        self._pruned_at: datetime | None = None
        self._late: set[asyncio.Task[Any]] = set()  # launches and kills past their tick

    async def tick(
        self, led: Led | None = None, *, budget_s: float | None = None
    ) -> list[dict[str, Any]]:
        """One tick over every active queue and pool this server ticks (``led``: the
        unpinned queues, those pinned to its node id, or both — the default); one
        decision, and one audit row, for each.

        ``budget_s`` bounds how long the tick waits for its launches and kills: one still
        running then (a slow or hung provider) goes on in the background and writes its
        own audit row when it ends, so the loop's next tick starts on time. ``None`` waits
        for every one (a tick run by hand returns every decision). Returns the decisions
        that were complete within the budget.
        """
        led = led or Led(unpinned=True, pinned=True)
        async with self._lock:
            return [outcome.to_json() for outcome in await self._tick(led, budget_s)]

    async def nudge(
        self, scopes: set[tuple[str, str]], led: Led, *, budget_s: float | None = None
    ) -> list[dict[str, Any]]:
        """Plan ``scopes`` (namespace id, scope) now, as a tick would and only them: one
        decision each, recorded like any other. The loop calls it when a submit lands in
        a scope the last tick left at zero, so scale-from-zero does not wait for the next
        tick; each such scope is nudged at most once until the next full tick."""
        async with self._lock:
            return [o.to_json() for o in await self._tick(led, budget_s, only=scopes)]

    async def close(self) -> None:
        """Stop waiting for launches and kills still running from earlier ticks."""
        late, self._late = self._late, set()
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
        self.scalers.close()

    async def _tick(
        self, led: Led, budget_s: float | None, only: set[tuple[str, str]] | None = None
    ) -> list[Outcome]:
        now = self.clock()
        started = asyncio.get_running_loop().time()
        async with self.store.write() as conn:
            expired = await launch_store.expire(conn, now)
        async with self.store.read() as conn:
            snap = await ctl_store.snapshot(
                conn, self.node_id if led.pinned else None, unpinned=led.unpinned
            )
            units = [u for u in units_of(snap) if only is None or (u.namespace_id, u.scope) in only]
            in_flight = await launch_store.in_flight_by_scope(
                conn, [(u.namespace_id, u.scope) for u in units], now
            )
            wanted = {(u.namespace_id, p) for u in units if (p := provider_of(u)) is not None}
            wanted |= {(launch["namespace_id"], launch["provider_name"]) for launch in expired}
            registrations = await ctl_store.registrations(conn, wanted)
        for n, unit in enumerate(units, 1):
            unit.signals = gather_signals(unit, snap, in_flight[(unit.namespace_id, unit.scope)])
            if n % YIELD_EVERY == 0:
                await asyncio.sleep(0)  # let the API's requests in between
        decisions = await self._decide_all(units, snap.counters)
        outcomes: list[Outcome | None] = [
            None
            if d.action in ("scale_up", "scale_down")
            else Outcome(u, d, signals_json(u.signals))
            for u, d in zip(units, decisions, strict=True)
        ]
        # a launch or a kill: first what the store must know before this tick ends (the
        # launch in flight, the victim retiring), then the provider calls, as tasks
        jobs = await self._prepare(units, decisions, outcomes, registrations)
        gate = asyncio.Semaphore(CONCURRENCY)

        async def gated(job: Awaitable[Any]) -> Any:
            async with gate:
                return await job

        acting = {i: asyncio.create_task(gated(job)) for i, job in jobs.items()}
        stopping = [
            asyncio.create_task(gated(self.ops.stop_expired(launch, registrations)))
            for launch in expired
        ]
        if acting or stopping:
            wait_s = (
                None
                if budget_s is None
                else max(0.0, budget_s - (asyncio.get_running_loop().time() - started))
            )
            await asyncio.wait([*acting.values(), *stopping], timeout=wait_s)
        for i, task in acting.items():
            if task.done():
                outcomes[i] = task.result()
            else:
                self._finish_later(task, now)
        for task in stopping:
            if not task.done():
                self._late.add(task)
                task.add_done_callback(self._late.discard)
        final = [outcome for outcome in outcomes if outcome is not None]
        changed = _changed_counters(units, decisions, snap.counters)
        await self._record(final, changed, now)
        await self._after_tick(units, decisions, now, nudge=only is not None)
        return final

    async def _after_tick(
        self, units: Sequence[Unit], decisions: Sequence[Decision], now: datetime, *, nudge: bool
    ) -> None:
        if nudge:  # a nudge leaves its scopes out of at_zero until the next full tick
            return
        self.at_zero = _at_zero(units, decisions)
        await self._prune(now)

    async def _prune(self, now: datetime) -> None:
        """Drop no-op events past their retention, at most once a minute."""
        if self._pruned_at is not None and now - self._pruned_at < PRUNE_EVERY:
            return
        self._pruned_at = now
        async with self.store.write() as conn:
            await ctl_store.prune_noops(conn, now - timedelta(seconds=self.noop_retention_s))

    async def _decide_all(
        self, units: Sequence[Unit], counters: dict[tuple[str, str], Counters]
    ) -> list[Decision]:
        """Every unit's decision; custom scalers are called together (each bounded by the
        call time-out), so a tick waits for the slowest scaler, not for their sum."""
        decisions: list[Decision | None] = []
        asks: dict[int, Awaitable[Decision]] = {}
        for n, unit in enumerate(units):
            assert unit.signals is not None
            queue = unit.policy_queue
            policy = scaling.Policy.from_spec(queue.spec)
            path = queue.spec.custom_scaler_udf
            if path is None:
                kept = counters.get((unit.namespace_id, unit.scope), Counters())
                decisions.append(scaling.decide(policy, unit.signals, kept))
            else:
                decisions.append(None)
                asks[n] = self._ask_scaler(
                    path, (unit.namespace_id, unit.scope), policy, unit.signals
                )
            if (n + 1) % YIELD_EVERY == 0:
                await asyncio.sleep(0)
        answers = await asyncio.gather(*asks.values())
        for n, decision in zip(asks, answers, strict=True):
            decisions[n] = decision
        return [d for d in decisions if d is not None]

    async def _ask_scaler(
        self, path: str, key: tuple[str, str], policy: scaling.Policy, s: Signals
    ) -> Decision:
        try:
            answer = await self.scalers.call(path, s, timeout_s=self.call_timeout_s, key=key)
        except scalers.ScalerError as exc:
            return custom_scaler.scaler_failed(str(exc))
        return custom_scaler.interpret_scaler_answer(answer, policy, s)

    def _finish_later(self, task: asyncio.Task[Outcome], now: datetime) -> None:
        """A launch or kill still running when its tick ended: its audit row (dated at its
        decision) is written when it ends."""

        async def finish() -> None:
            try:
                outcome = await task
            except asyncio.CancelledError:
                task.cancel()
                raise
            except Exception:
                log.exception("a launch or kill that outlived its tick failed")
                return
            log.info(
                "%s %s: %s", outcome.unit.scope, outcome.decision.action, outcome.decision.reason
            )
            await self._record([outcome], {}, now)

        late = asyncio.create_task(finish())
        self._late.add(late)
        late.add_done_callback(self._late.discard)

    # --- scale-up and scale-down -------------------------------------------------------

    async def _prepare(
        self,
        units: Sequence[Unit],
        decisions: Sequence[Decision],
        outcomes: list[Outcome | None],
        registrations: dict[tuple[str, str], Any],
    ) -> dict[int, Awaitable[Outcome]]:
        """Record this tick's launches and mark its victims retiring; fill in the outcome
        of each that cannot go ahead, and return the provider calls of the others."""
        jobs: dict[int, Awaitable[Outcome]] = {}
        launching: list[tuple[int, str]] = []
        for i, (unit, decision) in enumerate(zip(units, decisions, strict=True)):
            before = signals_json(unit.signals)
            if decision.action == "scale_up":
                name = provider_of(unit)
                if name is None:
                    failure = scaling.no_provider_reason(unit.launch_from.name)
                    outcomes[i] = Outcome(unit, scaling.downgrade(decision, failure), before)
                else:
                    launching.append((i, name))
            elif decision.action == "scale_down":
                victim = fleet.pick_victim(unit.workers)
                if victim is None:
                    none_idle = "no idle worker to kill (busy workers are never killed)"
                    outcomes[i] = Outcome(unit, scaling.downgrade(decision, none_idle), before)
                    continue
                detail: dict[str, Any] = {"victim": victim.id}
                marked = await self.ops.mark_retiring(victim.id)
                if isinstance(marked, Retired):
                    not_idle = f"worker {victim.id} is {marked.status}; not killed"
                    downgraded = scaling.downgrade(decision, not_idle)
                    outcomes[i] = Outcome(unit, downgraded, before, detail)
                    continue
                jobs[i] = self._kill(unit, decision, victim.id, marked, registrations)
        wanted = [
            LaunchSpec(
                namespace_id=units[i].namespace_id,
                namespace=units[i].namespace,
                scope=units[i].scope,
                provider_name=name,
                registration=registrations.get((units[i].namespace_id, name)),
                template=units[i].launch_from.spec.daemon_template,
                membership=units[i].membership,
            )
            for i, name in launching
        ]
        for (i, name), prepared in zip(launching, await self.ops.prepare(wanted), strict=True):
            unit, decision = units[i], decisions[i]
            if isinstance(prepared, Launched):
                assert prepared.failure is not None
                downgraded = scaling.downgrade(decision, prepared.failure)
                outcomes[i] = Outcome(
                    unit, downgraded, signals_json(unit.signals), {"provider": name}
                )
            else:
                jobs[i] = self._launch(unit, decision, name, prepared)
        return jobs

    async def _launch(
        self, unit: Unit, decision: Decision, name: str, prepared: Prepared
    ) -> Outcome:
        before = signals_json(unit.signals)
        detail = {"provider": name, "launch_id": prepared.launch_id}
        try:
            launched = await self.ops.start(prepared)
        except Exception as exc:  # the store failed around the call: this decision only
            log.exception("launch %s for %s", prepared.launch_id, unit.scope)
            failure = f"launch failed: {type(exc).__name__}: {exc}"
            return Outcome(unit, scaling.downgrade(decision, failure), before, detail)
        if launched.failure is not None:
            return Outcome(unit, scaling.downgrade(decision, launched.failure), before, detail)
        after = {**before, "in_flight": before["in_flight"] + 1}
        return Outcome(unit, decision, after, detail)

    async def _kill(
        self,
        unit: Unit,
        decision: Decision,
        victim: str,
        launch: RowMapping | None,
        registrations: dict[tuple[str, str], Any],
    ) -> Outcome:
        before = signals_json(unit.signals)
        detail: dict[str, Any] = {"victim": victim}
        try:
            retired = await self.ops.finish_retiring(
                namespace_id=unit.namespace_id,
                worker_id=victim,
                launch=launch,
                reason=decision.reason,
                registrations=registrations,
            )
        except Exception as exc:  # the store failed around the call: this decision only
            log.exception("retiring %s for %s", victim, unit.scope)
            failure = f"kill failed: {type(exc).__name__}: {exc}"
            return Outcome(unit, scaling.downgrade(decision, failure), before, detail)
        if retired.failure is not None:
            return Outcome(unit, scaling.downgrade(decision, retired.failure), before, detail)
        after = {**before, "daemon_count": before["daemon_count"] - 1}
        return Outcome(unit, decision, after, detail)

    # --- the audit rows and counters ---------------------------------------------------

    async def _record(
        self,
        outcomes: Sequence[Outcome],
        counters: dict[tuple[str, str], Counters],
        now: datetime,
    ) -> None:
        """The audit rows of ``outcomes`` and the ``counters`` that changed, together."""
        rows = []
        for outcome in outcomes:
            unit, decision = outcome.unit, outcome.decision
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
            await ctl_store.save_counters(conn, counters, now)


_NUDGED_KINDS: Final = ("fully_elastic", "max_count")  # hysteresis policies are left alone


def _at_zero(units: Sequence[Unit], decisions: Sequence[Decision]) -> dict[str, tuple[str, str]]:
    """The queues of the scopes this tick left at zero, each with its scope: no daemon,
    nothing in flight, nothing pending, a target policy without a custom scaler, and a
    no-op decided (a first submit to one of them is planned at once)."""
    zero: dict[str, tuple[str, str]] = {}
    for unit, decision in zip(units, decisions, strict=True):
        s, spec = unit.signals, unit.policy_queue.spec
        if s is None or decision.action != "tick_noop" or spec.custom_scaler_udf is not None:
            continue
        kind = spec.elasticity.kind if spec.elasticity else "fixed"
        if kind in _NUDGED_KINDS and s.daemon_count == s.in_flight == s.pending == 0:
            for queue in unit.members:
                zero[queue.id] = (unit.namespace_id, unit.scope)
    return zero


def _changed_counters(
    units: Sequence[Unit],
    decisions: Sequence[Decision],
    old: dict[tuple[str, str], Counters],
) -> dict[tuple[str, str], Counters]:
    """The counters a tick's decisions change (whatever their launches or kills become)."""
    changed: dict[tuple[str, str], Counters] = {}
    for unit, decision in zip(units, decisions, strict=True):
        key = (unit.namespace_id, unit.scope)
        if old.get(key, Counters()) != decision.counters:
            changed[key] = decision.counters
    return changed
