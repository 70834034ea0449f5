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
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy import RowMapping

from lakeshore import logs
from lakeshore.domain.scaling import Counters
from lakeshore.elasticity import plan
from lakeshore.elasticity.snapshot import Key, Snapshot
from lakeshore.services.fleet import scalers
from lakeshore.services.fleet.fleet_ops import FleetOps, Launched, LaunchSpec, Prepared, Retired
from lakeshore.services.fleet.outcomes import Outcome, as_json, noop_outcomes
from lakeshore.services.metrics import Metrics
from lakeshore.services.taskqueue.notify import Notifier
from lakeshore.store import controller as ctl_store
from lakeshore.store import launches as launch_store
from lakeshore.store.engine import Store
from lakeshore.store.leadership import Led

log = logging.getLogger("lakeshore.controller")

Clock = Callable[[], datetime]
DEFAULT_CALL_TIMEOUT_S = 10.0
NO_PROVIDER = "(none)"  # a victim no launch of the controller's started: the label it gets


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
        notifier: Notifier | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.clock = clock
        self.server_url = server_url
        self.node_id = node_id
        self.call_timeout_s = call_timeout_s
        self.scalers = scalers.Registry(allowed_scalers)
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
        # the queues the last full tick planned, and those looked up since as fresh: a
        # submit to any other queue is to one created since (see :meth:`is_fresh`)
        self.known: set[str] | None = None
        self._queues = ctl_store.QueueCache()  # parsed queues, kept while unchanged
        # scope → (id, fingerprint) of the last no-op row written for it, to fold into
        self._last_rows: dict[Key, tuple[int, tuple[Any, ...]]] = {}
        self._previous: dict[Key, plan.Step] = {}  # the last plan's steps, by scope
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
            began = time.perf_counter()
            outcomes = await self._tick(led, budget_s)
            decisions = await asyncio.to_thread(as_json, outcomes)  # 10,000 dicts: off the loop
            if self.metrics is not None:
                self.metrics.tick_seconds.observe(time.perf_counter() - began)
                self.metrics.count_decisions(decisions)
            return decisions

    async def nudge(
        self, scopes: set[tuple[str, str]], led: Led, *, budget_s: float | None = None
    ) -> list[dict[str, Any]]:
        """Plan ``scopes`` (namespace id, scope) now, as a tick would and only them: one
        decision each, recorded like any other. The loop calls it when a submit lands in
        a scope the last tick left at zero, so scale-from-zero does not wait for the next
        tick; each such scope is nudged at most once until the next full tick."""
        async with self._lock:
            decisions = as_json(await self._tick(led, budget_s, only=scopes))
            if self.metrics is not None:
                self.metrics.count_decisions(decisions)
            return decisions

    def is_fresh(self, key: str) -> bool:
        """Whether a wake-up's ``key`` is a queue no tick has planned yet (created since
        the last full tick); each is answered once until the next full tick."""
        if self.known is None or ":" in key or key in self.known:
            return False  # before a first tick, or a worker's or a stream's key
        self.known.add(key)
        return True

    async def scopes_at_zero(self, queue_ids: set[str]) -> set[Key]:
        """The scopes of ``queue_ids`` (active queues with a policy a nudge plans, and no
        custom scaler) that hold no daemon and no launch in flight: a first submit to
        one of them is planned at once, as a submit to a scope a tick left at zero."""
        if not queue_ids:
            return set()
        now = self.clock()
        async with self.store.read() as conn:
            return await ctl_store.scopes_at_zero(conn, sorted(queue_ids), plan.NUDGED_KINDS, now)

    async def close(self) -> None:
        """Stop waiting for launches and kills still running from earlier ticks."""
        late, self._late = self._late, set()
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
        self.scalers.close()

    async def _tick(
        self, led: Led, budget_s: float | None, only: set[Key] | None = None
    ) -> list[Outcome]:
        now = self.clock()
        started = asyncio.get_running_loop().time()
        async with self.store.write() as conn:
            expired = await launch_store.expire(conn, now)
        async with self.store.read() as conn:
            snap = await ctl_store.snapshot(
                conn,
                self.node_id if led.pinned else None,
                unpinned=led.unpinned,
                now=now,
                cache=self._queues,
            )
        # the plan is pure and CPU-bound: computed in a thread, the API's event loop
        # serves requests while it runs
        steps = await asyncio.to_thread(plan.plan, snap, now, only=only, previous=self._previous)
        steps = await self._ask_scalers(steps, snap)
        async with self.store.read() as conn:
            short = sorted({q.id for s in steps if s.needs_workers for q in s.unit.members})
            if short:  # the victims of scale-downs, from their queues' workers
                steps = plan.with_workers(steps, await ctl_store.workers_of(conn, short))
            wanted = {(s.unit.namespace_id, s.launch.provider) for s in steps if s.launch}
            wanted |= {(launch["namespace_id"], launch["provider_name"]) for launch in expired}
            registrations = await ctl_store.registrations(conn, wanted)
        outcomes = await asyncio.to_thread(noop_outcomes, steps)
        # a launch or a kill: first what the store must know before this tick ends (the
        # launch in flight, the victim retiring), then the provider calls, as tasks
        jobs, launching = await self._prepare(steps, outcomes, registrations)
        gate = self.ops.gate  # a launch takes it for its provider call only (FleetOps.start)

        async def gated(job: Awaitable[Any]) -> Any:
            async with gate:
                return await job

        acting = {
            i: asyncio.create_task(job if i in launching else gated(job)) for i, job in jobs.items()
        }
        stopping = [  # each takes the gate for its provider call (FleetOps.stop_expired)
            asyncio.create_task(self.ops.stop_expired(launch, registrations)) for launch in expired
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
        await self._record(final, plan.changed_counters(steps), now)
        if only is None:  # a nudge leaves its scopes out of at_zero until the next full tick
            self.at_zero = await asyncio.to_thread(plan.at_zero, steps)
            self.known = {queue.id for step in steps for queue in step.unit.members}
            self._previous = {step.key: step for step in steps}
            self._last_rows = {k: v for k, v in self._last_rows.items() if k in self._previous}
        else:
            self._previous.update((step.key, step) for step in steps)
        return final

    async def _ask_scalers(self, steps: list[plan.Step], snap: Snapshot) -> list[plan.Step]:
        """Settle the steps that wait on a custom scaler: the scalers are asked together
        (each bounded by the call time-out), so a tick waits for the slowest, not for
        their sum."""
        asking = [i for i, step in enumerate(steps) if step.scaler is not None]
        if not asking:
            return steps
        answers = await asyncio.gather(*(self._ask_scaler(steps[i], snap) for i in asking))
        settled = list(steps)
        for i, step in zip(asking, answers, strict=True):
            settled[i] = step
        return settled

    async def _ask_scaler(self, step: plan.Step, snap: Snapshot) -> plan.Step:
        assert step.scaler is not None
        try:
            reply = await self.scalers.call(
                step.scaler, step.signals, timeout_s=self.call_timeout_s, key=step.key
            )
        except scalers.ScalerError as exc:
            return plan.answer(step, snap, None, failure=str(exc))
        return plan.answer(step, snap, reply)

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
            step = outcome.step
            where = logs.ids(namespace=step.unit.namespace, queue=step.unit.scope)
            log.info(
                "%s %s: %s",
                step.unit.scope,
                step.action,
                step.decision.reason,
                extra={**where, "action": step.action},
            )
            await self._record([outcome], {}, now)

        late = asyncio.create_task(finish())
        self._late.add(late)
        late.add_done_callback(self._late.discard)

    # --- scale-up and scale-down -------------------------------------------------------

    async def _prepare(
        self,
        steps: Sequence[plan.Step],
        outcomes: list[Outcome | None],
        registrations: dict[tuple[str, str], Any],
    ) -> tuple[dict[int, Coroutine[Any, Any, Outcome]], set[int]]:
        """Record this tick's launches and mark its victims retiring; fill in the outcome
        of each that cannot go ahead, and return the provider calls of the others (and
        which of them are launches). A step of several launches (``max_step``) or kills
        is one job, and one audit row."""
        jobs: dict[int, Coroutine[Any, Any, Outcome]] = {}
        launching: list[int] = []
        for i, step in enumerate(steps):
            if step.launch is not None:
                launching.append(i)
            elif step.victims:
                marked, busy = await self._mark(step)
                if not marked:
                    detail: dict[str, Any] = {"victim": step.victim}
                    outcomes[i] = Outcome(step.downgraded("; ".join(busy)), step.before(), detail)
                    continue
                jobs[i] = self._kill_all(step, marked, busy, registrations)
        wanted: list[LaunchSpec] = []
        owners: list[int] = []
        for i in launching:
            step, launch = steps[i], steps[i].launch
            assert launch is not None
            one = LaunchSpec(
                namespace_id=step.unit.namespace_id,
                namespace=step.unit.namespace,
                scope=step.unit.scope,
                provider_name=launch.provider,
                registration=registrations.get((step.unit.namespace_id, launch.provider)),
                template=launch.template,
                membership=launch.membership,
            )
            wanted += [one] * launch.count
            owners += [i] * launch.count
        grouped: dict[int, list[Prepared | Launched]] = {}
        for i, prepared in zip(owners, await self.ops.prepare(wanted), strict=True):
            grouped.setdefault(i, []).append(prepared)
        for i, group in grouped.items():
            step = steps[i]
            assert step.launch is not None
            ready = [p for p in group if isinstance(p, Prepared)]
            failed = [p.failure for p in group if isinstance(p, Launched) and p.failure]
            for _ in failed:
                self._count_call(step.launch.provider, "launch", ok=False)
            if not ready:
                detail = {"provider": step.launch.provider}
                outcomes[i] = Outcome(step.downgraded(failed[0]), step.before(), detail)
            else:
                jobs[i] = self._launch(step, ready, failed)
        return jobs, set(launching)

    async def _mark(self, step: plan.Step) -> tuple[list[tuple[str, RowMapping | None]], list[str]]:
        """Mark a step's victims retiring: those marked (with their launch records), and
        why each of the others is not killed (busy, or gone)."""
        marked: list[tuple[str, RowMapping | None]] = []
        busy: list[str] = []
        for victim in step.victims:
            found = await self.ops.mark_retiring(victim)
            if isinstance(found, Retired):
                busy.append(f"worker {victim} is {found.status}; not killed")
            else:
                marked.append((victim, found))
        return marked, busy

    def _count_call(self, provider: str, call: str, *, ok: bool) -> None:
        if self.metrics is not None:
            self.metrics.fleet_calls.labels(provider, call, "ok" if ok else "failed").inc()

    async def _launch(
        self, step: plan.Step, ready: Sequence[Prepared], failed: Sequence[str]
    ) -> Outcome:
        """Start the launches a step recorded, together: one outcome for them all, a
        scale-up while any started (its reason says how many did not)."""
        assert step.launch is not None
        provider = step.launch.provider
        results = await asyncio.gather(*(self._start(step, p) for p in ready))
        failures = [*failed, *(r for r in results if r is not None)]
        started = [p.launch_id for p, r in zip(ready, results, strict=True) if r is None]
        before = step.before()
        detail: dict[str, Any] = {"provider": provider, "launch_id": ready[0].launch_id}
        if step.launch.count > 1:
            detail["launch_ids"] = started
        if not started:
            return Outcome(step.downgraded(failures[0]), before, detail)
        step = _partly(step, len(started), failures, step.launch.count, "failed")
        after = {**before, "in_flight": before["in_flight"] + len(started)}
        return Outcome(step, after, detail)

    async def _start(self, step: plan.Step, prepared: Prepared) -> str | None:
        """One launch's provider call: its failure, or None."""
        assert step.launch is not None
        try:
            launched = await self.ops.start(prepared)
        except Exception as exc:  # the store failed around the call: this launch only
            log.exception(
                "launch %s for %s",
                prepared.launch_id,
                step.unit.scope,
                extra=logs.ids(
                    namespace=step.unit.namespace,
                    queue=step.unit.scope,
                    launch=prepared.launch_id,
                    provider=step.launch.provider,
                ),
            )
            failure: str | None = f"launch failed: {type(exc).__name__}: {exc}"
        else:
            failure = launched.failure
        self._count_call(step.launch.provider, "launch", ok=failure is None)
        return failure

    async def _kill_all(
        self,
        step: plan.Step,
        marked: Sequence[tuple[str, RowMapping | None]],
        busy: Sequence[str],
        registrations: dict[tuple[str, str], Any],
    ) -> Outcome:
        """Retire a step's victims marked retiring, together: one outcome for them all."""
        results = await asyncio.gather(
            *(self._kill(step, victim, launch, registrations) for victim, launch in marked)
        )
        failures = [*busy, *(r for r in results if r is not None)]
        killed = [victim for (victim, _), r in zip(marked, results, strict=True) if r is None]
        before = step.before()
        detail: dict[str, Any] = {"victim": marked[0][0]}
        if len(step.victims) > 1:
            detail["victims"] = killed
        if not killed:
            return Outcome(step.downgraded(failures[0]), before, detail)
        step = _partly(step, len(killed), failures, len(step.victims), "not killed")
        after = {**before, "daemon_count": before["daemon_count"] - len(killed)}
        return Outcome(step, after, detail)

    async def _kill(
        self,
        step: plan.Step,
        victim: str,
        launch: RowMapping | None,
        registrations: dict[tuple[str, str], Any],
    ) -> str | None:
        """Retire one victim: its failure, or None."""
        provider = launch["provider_name"] if launch is not None else NO_PROVIDER
        try:
            retired = await self.ops.finish_retiring(
                namespace_id=step.unit.namespace_id,
                worker_id=victim,
                launch=launch,
                reason=step.decision.reason,
                registrations=registrations,
            )
        except Exception as exc:  # the store failed around the call: this victim only
            log.exception(
                "retiring %s for %s",
                victim,
                step.unit.scope,
                extra=logs.ids(namespace=step.unit.namespace, queue=step.unit.scope, worker=victim),
            )
            failure: str | None = f"kill failed: {type(exc).__name__}: {exc}"
        else:
            failure = retired.failure
        self._count_call(provider, "kill", ok=failure is None)
        return failure

    # --- the audit rows and counters ---------------------------------------------------

    async def _record(
        self,
        outcomes: Sequence[Outcome],
        counters: dict[Key, Counters],
        now: datetime,
    ) -> None:
        """The audit rows of ``outcomes`` and the ``counters`` that changed, together.

        A no-op identical to the last row this controller wrote for its scope (same
        reason, rule, hint and signals) is folded into that row (``repeats + 1``,
        ``last_at``) rather than written again, so a steady fleet leaves one row per
        queue, not one per tick."""
        folding, fresh = await asyncio.to_thread(self._fold_or_write, outcomes)
        async with self.store.write() as conn:
            folded = await ctl_store.fold_events(conn, list(folding), now)
            fresh += [o for i, o in folding.items() if i not in folded]  # its row moved on
            ids = await ctl_store.write_events(conn, [o.row(now) for o in fresh])
            await ctl_store.save_counters(conn, counters, now)
        for outcome, event_id in zip(fresh, ids, strict=True):
            mark = outcome.mark
            if mark is None:
                self._last_rows.pop(outcome.step.key, None)
            else:
                self._last_rows[outcome.step.key] = (event_id, mark)

    def _fold_or_write(
        self, outcomes: Sequence[Outcome]
    ) -> tuple[dict[int, Outcome], list[Outcome]]:
        """The outcomes to fold into the row last written for their scope (by its id),
        and those that need a row of their own."""
        folding: dict[int, Outcome] = {}
        fresh: list[Outcome] = []
        for outcome in outcomes:
            last = self._last_rows.get(outcome.step.key)
            if last is not None and last[1] == outcome.mark:
                folding[last[0]] = outcome
            else:
                fresh.append(outcome)
        return folding, fresh


def _partly(step: plan.Step, done: int, failures: Sequence[str], of: int, what: str) -> plan.Step:
    """A step of several launches or kills of which only ``done`` went through: its
    reason says how many of ``of`` ``what`` and why the first did, its count is ``done``
    (the step as it was when none failed)."""
    if not failures:
        return step
    reason = f"{step.decision.reason}; {len(failures)} of {of} {what}: {failures[0]}"
    return replace(step, decision=replace(step.decision, reason=reason, count=done))
