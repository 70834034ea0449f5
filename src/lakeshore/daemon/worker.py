"""The daemon's loop: hello, claim, run each invocation, heartbeat, report.

One asyncio task claims (long-poll, up to the free capacity), one heartbeats, and one
task per invocation awaits its outcome from the daemon's runner (:mod:`.runners`: a warm
pool of child processes, or its own threads), chosen once as it starts. On SIGTERM (or
SIGINT) the daemon stops claiming, lets what it holds finish, and exits; ``burst`` exits
once nothing it runs is left and its queues hold no pending work (a retry waiting out its
backoff is waited for; while its work runs, it claims only as each outcome is reported).
Outcomes go out in batches that also claim the freed slots again (:mod:`.reporter`); a
report that fails is retried until it is delivered or the lease is known to be lost, so
a finished invocation is reported once.

What a crash costs: the daemon tells its :mod:`.sentinel` each invocation as it begins
(before it runs) and ends, and its heartbeats list what runs apart from what is
prefetched. Should the daemon die, the sentinel reports what had begun: only that is
charged an attempt, and the rest goes back to the queue at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lakeshore import backoff, jsontext, logs, refusals, transport
from lakeshore.daemon import linux
from lakeshore.daemon.pool import PoolConfig
from lakeshore.daemon.prefetch import Prefetch
from lakeshore.daemon.reporter import Reporter
from lakeshore.daemon.runner import Outcome, Processes
from lakeshore.daemon.runners import Invocation, Runner
from lakeshore.daemon.sentinel import Sentinel
from lakeshore.daemon.streaming import ItemSender
from lakeshore.daemon.threads import Threads
from lakeshore.daemon.turns import Turns
from lakeshore.domain import runners as daemon_runners

if TYPE_CHECKING:
    import httpx

log = logging.getLogger("lakeshore.daemon")


@dataclass
class DaemonConfig:
    server: str
    token: str
    queues: Sequence[str]
    namespace: str | None = None
    capacity: int = 1
    # invocations claimed ahead, waiting for a free slot: None learns how many (.prefetch)
    prefetch: int | None = None
    tags: Sequence[str] = ()
    runner: str = daemon_runners.PROCESS  # process: a warm pool; thread: its own threads
    worker_id: str | None = None
    launch_id: str | None = None
    burst: bool = False
    claim_timeout_s: float = 20.0
    grace_s: float = 30.0
    orphan_after_s: float | None = None
    hello_attempts: int = 30
    pool: PoolConfig = field(default_factory=PoolConfig)  # the children that run invocations
    retry_s: float = 1.0  # first wait after a failed request; doubles up to 5 s
    # an httpx transport that serves the API in-process (tests), instead of the network
    transport: httpx.AsyncBaseTransport | None = None


@dataclass
class Daemon:
    config: DaemonConfig
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    running: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    completed: int = 0
    failed: int = 0
    retired: bool = False
    orphaned: bool = False
    unreachable_since: float | None = None
    worker_id: str = ""
    reporter: Reporter = field(init=False)
    reporting: set[str] = field(default_factory=set)  # outcomes on their way to the server
    polling: bool = False  # a claim is out (and may be waiting for work)
    closing: bool = False  # the background tasks are being stopped
    sentinel: Sentinel = field(default_factory=Sentinel)  # kills UDF groups if it dies
    slots: Turns = field(init=False)  # --capacity: what runs at once, given in turns by key
    prefetched: set[str] = field(default_factory=set)  # held, waiting for a slot
    ahead: Prefetch = field(init=False)  # how many to hold ahead of the free slots
    session: str = field(default_factory=lambda: secrets.token_hex(8))  # this process's hello
    runner: Runner = field(init=False)  # what runs each invocation (--runner)
    http: transport.AsyncTransport = field(init=False)  # every request to the server

    async def run(self, *, own_process: bool = False) -> int:
        """Serve until stopped (``stop``, SIGTERM/SIGINT when ``own_process``, retired,
        orphaned, or a burst's end); 0 once everything it held is finished and reported.

        The process is the daemon's only under ``lakeshore daemon run`` (``own_process``):
        then it takes SIGTERM/SIGINT and adopts the orphans of its UDFs (a subreaper, so it
        reaps them), not when a caller drives it on an event loop of its own (a test, an
        embedding)."""
        if own_process:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.add_signal_handler(sig, self.stop.set)
            linux.become_subreaper()
        self.slots = Turns(self.config.capacity)
        self.ahead = Prefetch(self.config.capacity, fixed=self.config.prefetch)
        self.sentinel.start()
        self.runner = _runner_for(self.config, self.sentinel)
        ended = False
        try:
            code = await self._serve()
            ended = True
            return code
        finally:
            await self.runner.close()  # when it never said hello (else closed already)
            # ended by an error, it handed nothing back: the sentinel reports it as a crash
            await asyncio.to_thread(self.sentinel.stop, report=not ended)

    async def _serve(self) -> int:
        headers = {"Authorization": f"Bearer {self.config.token}"}
        read_s = self.config.claim_timeout_s + 10.0
        self.runner.warm(self.config.capacity)  # children start up during the hello
        # claims, hellos, reports, heartbeats and streamed items: one transport
        async with transport.aconnect(
            self.config.server, headers=headers, read_s=read_s, via=self.config.transport
        ) as http:
            self.http = http
            info = await self._hello()
            self.worker_id = info["id"]
            if self.config.transport is None:  # else no address the sentinel could reach
                self.sentinel.serve(
                    server=self.config.server,
                    token=self.config.token,
                    worker=self.worker_id,
                    session=self.session,
                    lease_s=float(info.get("lease_s") or 30.0),
                )
            queues = ", ".join(info["queues"])
            log.info(
                "worker %s serving %s",
                self.worker_id,
                queues,
                extra=logs.ids(worker=self.worker_id),
            )
            with logs.bound(worker=self.worker_id):  # every later line names the worker
                return await self._serve_as(http, info)

    async def _serve_as(self, http: transport.AsyncTransport, info: dict[str, Any]) -> int:
        """Serve once registered: heartbeats, reports, claims, then drain and leave."""
        beat = asyncio.create_task(self._heartbeat(info["heartbeat_s"]), name="heartbeat")
        self.reporter = Reporter(
            http,
            lambda: f"/v1/workers/{self.worker_id}/results",
            free_after=self._free_after,
            on_claimed=self._start_all,
            retry_s=self.config.retry_s / 5,
            on_trip=self.ahead.tripped,
        )
        reports = asyncio.create_task(self.reporter.run(), name="reporter")
        try:
            # no wait for the pool's children (started before the hello): their start-up
            # overlaps the first claim's round trip, and what it leases starts as each
            # child is ready
            await self._claim_loop()
            await self._drain()
            if not self.retired and not self.orphaned:
                await self._bye()
        finally:
            self.closing = True
            for task in (beat, reports):
                await _cancelled(task)
            await self.runner.close()
        return 0

    async def _bye(self) -> None:
        """Leave: whatever is still held goes back to the queue at once."""
        try:
            response = await self.http.post(f"/v1/workers/{self.worker_id}/bye")
            if response.is_success and response.json()["released"]:
                log.info("handed back %d invocation(s)", response.json()["released"])
        except transport.Unreachable as exc:
            log.warning("could not say goodbye (%s); leases will expire", exc)

    async def _hello(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "queues": list(self.config.queues),
            "runners": [self.config.runner],
            "tags": list(self.config.tags),
            "capabilities": {
                "max_invocations": self.config.capacity,
                # the most it may hold ahead (what it holds now is learned: .prefetch)
                **({"prefetch": self.ahead.declared} if self.ahead.declared else {}),
                "session": self.session,  # names this process's hello in a crash report
            },
        }
        for key, value in (
            ("id", self.worker_id or self.config.worker_id),  # a second hello keeps the id
            ("namespace", self.config.namespace),
            ("launch_id", self.config.launch_id),
        ):
            if value:
                body[key] = value

        async def once() -> transport.Answer:
            if self.stop.is_set():
                raise DaemonError("stopped before the server answered hello")
            try:
                return await self.http.post("/v1/workers/hello", json=body)
            except transport.Unreachable as exc:
                log.warning("hello failed (%s); retrying", exc)
                raise

        def for_now(response: transport.Answer) -> bool:
            if _transient(response):
                log.warning("hello refused for now (%d); retrying", response.status_code)
                return True
            return False

        tries = backoff.aretrying(
            lambda exc: isinstance(exc, transport.Unreachable) and not self._orphaned(),
            tries=self.config.hello_attempts,
            first_s=self.config.retry_s,
            max_s=5.0,
            again=for_now,
            give_up=lambda state: state.outcome.result() if state.outcome else None,
            sleep=self._sleep,
        )
        response: transport.Answer = await tries(once)  # the last refusal, raised below
        _raise_for(response)
        self.unreachable_since = None
        return dict(response.json())

    async def _claim_loop(self) -> None:
        failures = 0
        # a burst daemon's last empty claim answer: how long to wait for pending work (a
        # retry's backoff), or that there is none and the daemon may exit
        look: dict[str, Any] | None = None
        while not self.stop.is_set():
            free = self._holds() - len(self.running)
            if free <= 0 or (self.config.burst and self.running):
                # a burst daemon asks again once its work is done (each outcome's report
                # claims what it frees meanwhile): no claim while it runs, and a claim
                # that finds nothing then means its queues are empty
                await self._wait_for_room()
                look = None
                continue
            wait = self.config.claim_timeout_s
            if self.config.burst:
                burst_wait = _burst_wait(look, self.config.claim_timeout_s)
                if burst_wait is None:
                    return  # nothing runs, nothing is pending: done
                wait = burst_wait
            response = await self._ask(wait, free)
            if response == _STOP:
                return
            if not isinstance(response, transport.Answer):
                failures += 1
                await self._sleep(backoff.pause_s(failures, self.config.retry_s, 5.0))
                continue
            failures = 0
            answer = await self._take(response)
            if answer is None:
                return
            look = None if answer["invocations"] else answer

    async def _ask(self, wait: float, free: int) -> transport.Answer | str | None:
        """One claim: its answer, None to retry after a back-off (the server is away or
        overloaded), or ``_STOP`` (stopping, or orphaned)."""
        self.polling = True
        try:
            response = await self._post_or_stop(
                f"/v1/workers/{self.worker_id}/claim", {"timeout_s": wait, "max": free}
            )
        except transport.Unreachable as exc:
            log.warning("claim failed (%s); retrying", exc)
            return _STOP if self._orphaned() else None
        finally:
            self.polling = False
        self.unreachable_since = None
        if response is None:
            return _STOP
        if _transient(response):  # overloaded, restarting, or its store is down
            log.warning("claim refused for now (%d); retrying", response.status_code)
            return None
        return response

    async def _take(self, response: transport.Answer) -> dict[str, Any] | None:
        """Start what a claim returned and hand back the answer; None when the daemon
        should stop claiming."""
        if response.status_code == 410:
            log.info("retired by the control plane; finishing and exiting")
            self.retired = True
            self.stop.set()
            return None
        if response.status_code == 404:  # dropped while unreachable: register again
            log.warning("the server no longer knows this worker; saying hello again")
            await self._hello()
            return {"invocations": [], "next_in_s": 0.0}  # look again at once
        _raise_for(response)
        answer: dict[str, Any] = jsontext.parsed(response.content)
        self._start_all(answer["invocations"])
        return answer

    def _start_all(self, invocations: list[dict[str, Any]]) -> None:
        if invocations:
            self.sentinel.claimed([i["id"] for i in invocations])
        for claimed in invocations:
            invocation = Invocation.of(claimed)
            self.prefetched.add(invocation.id)  # until it has a slot
            task = asyncio.create_task(self._execute(invocation), name=invocation.id)
            self.running[invocation.id] = task
            task.add_done_callback(self._forget)

    def _free_after(self, reported: int) -> int:
        """Slots free once ``reported`` running invocations are done: what a report may
        claim. None when stopping, or while a claim is waiting for work anyway (the queues
        were empty when it asked: a second claim would only contend with it)."""
        if self.stop.is_set() or self.retired or self.polling:
            return 0
        return self._holds() - len(self.running) + reported

    def _holds(self) -> int:
        """The most invocations it holds at once: those running and those prefetched."""
        return self.config.capacity + self.ahead.value

    def _forget(self, task: asyncio.Task[None]) -> None:
        self.running.pop(task.get_name(), None)
        self.prefetched.discard(task.get_name())  # cancelled before it ever ran

    async def _post_or_stop(self, path: str, body: dict[str, Any]) -> transport.Answer | None:
        """A request that gives way to a stop signal (the claim long-poll)."""
        request = asyncio.create_task(self.http.post(path, body))
        stopping = asyncio.create_task(self.stop.wait())
        done, _ = await asyncio.wait({request, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if request in done:
            stopping.cancel()
            return request.result()
        request.cancel()
        with contextlib.suppress(asyncio.CancelledError, transport.Unreachable):
            await request
        return None

    async def _wait_for_room(self) -> None:
        tasks = set(self.running.values())
        stopping = asyncio.create_task(self.stop.wait())
        await asyncio.wait({*tasks, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self.stop.wait()

    async def _drain(self) -> None:
        waiting = [self.running[i] for i in self.prefetched if i in self.running]
        for task in waiting:  # not begun: they go back to the queue with the bye
            task.cancel()
        if waiting:
            await asyncio.wait(waiting)
        if not self.running:
            return
        log.info("finishing %d running invocation(s)", len(self.running))
        _, pending = await asyncio.wait(set(self.running.values()), timeout=self.config.grace_s)
        for task in pending:  # past the grace period: the leases will expire and be retried
            task.cancel()

    async def _heartbeat(self, every_s: float) -> None:
        while not self.closing:
            await asyncio.sleep(every_s)
            # only what ran when the heartbeat went out can be missing from its answer for
            # a reason: a claim answered meanwhile was leased after the server's look
            sent = list(self.running)
            # what began apart from what waits for a slot: a lease that runs out is
            # charged an attempt only if it began
            waiting = [i for i in sent if i in self.prefetched]
            begun = [i for i in sent if i not in self.prefetched]
            body = {"running": begun, "prefetched": waiting}
            try:
                response = await self.http.post(
                    f"/v1/workers/{self.worker_id}/heartbeat", json=body
                )
                if response.status_code == 410 and not self.stop.is_set():
                    log.info("retired by the control plane; finishing and exiting")
                    self.retired = True
                    self.stop.set()
                if response.is_success:
                    lost = set(sent) - set(response.json()["held"]) - self.reporting
                    for invocation_id in lost:
                        task = self.running.get(invocation_id)
                        if task is not None:
                            task.cancel()  # cancelled, or the lease was lost
            except transport.Unreachable as exc:
                log.warning("heartbeat failed: %s", exc)
                self._orphaned()
            except Exception:  # a malformed answer must not end the heartbeat
                log.exception("heartbeat answer not understood")

    def _orphaned(self) -> bool:
        """Whether the server has been unreachable for longer than ``orphan_after_s`` (a
        daemon launched by a server that is gone stops by itself)."""
        limit = self.config.orphan_after_s
        now = asyncio.get_running_loop().time()
        if self.unreachable_since is None:
            self.unreachable_since = now
        if limit is None or now - self.unreachable_since < limit:
            return False
        if not self.stop.is_set():
            log.warning("the server has been unreachable for %.0f s; exiting", limit)
            self.orphaned = True
            self.stop.set()
        return True

    async def _execute(self, invocation: Invocation) -> None:
        invocation_id = invocation.id
        try:
            # prefetched work waits here, its key's turn (a cancel ends the wait)
            await self.slots.acquire(invocation.concurrency_key)
        finally:
            self.prefetched.discard(invocation_id)
        # the sentinel knows before the run begins: a UDF that kills the daemon at once
        # is charged its attempt (the rest of what the daemon held is not)
        self.sentinel.begin(invocation_id)
        began = asyncio.get_running_loop().time()
        try:
            try:
                outcome = await self._run(invocation)
                self.ahead.ran(asyncio.get_running_loop().time() - began)
            finally:
                self.slots.release()  # the run is over: a prefetched invocation starts
                # now, not once the report's round trip is done
            # from here on the child is done: a heartbeat that no longer lists it (the
            # report was recorded before its answer came back) must not cancel the report
            self.reporting.add(invocation_id)
            try:
                await self._deliver(invocation_id, outcome)
            finally:
                self.reporting.discard(invocation_id)
        finally:
            self.sentinel.end(invocation_id)
            # its slot counts as free from now on, not from the task's end a turn of the
            # loop later: the next report, sent at once, claims it again
            self.running.pop(invocation_id, None)

    async def _run(self, invocation: Invocation) -> Outcome:
        base = f"/v1/workers/{self.worker_id}/invocations/{invocation.id}"
        items = ItemSender(self.http, f"{base}/stream")
        try:
            # a cancel (the lease is lost or the grace period is over) stops the run and
            # goes on once it has ended (an async run is cancelled, which may take a
            # moment): its slot is held until then, so no more run than --capacity
            outcome = await self.runner.run(invocation, items.put)
            await items.close()
        finally:
            items.cancel()
        if items.error is not None:
            outcome = Outcome(ok=False, error=items.error, retry=False)
        return outcome

    async def _deliver(self, invocation_id: str, outcome: Outcome) -> None:
        if outcome.ok:
            answer = await self.reporter.report_result(invocation_id, outcome.text)
            if answer.state == "succeeded":
                self.completed += 1
            if answer.state not in ("too_large", "invalid"):
                return  # recorded, or not this worker's to record (lease lost, undelivered)
            # the server will not store that result: the attempt fails, for good
            kind = "ResultTooLarge" if answer.state == "too_large" else "InvalidResult"
            error = {"type": kind, "message": answer.message or "the server refused the result"}
            outcome = Outcome(ok=False, error=error, retry=False)
        body = {"error": outcome.error, "retry": outcome.retry}
        if (await self.reporter.report(invocation_id, body)).state in _RECORDED:
            self.failed += 1


async def _cancelled(task: asyncio.Task[None], *, every_s: float = 1.0) -> None:
    """Cancel ``task`` and wait until it has ended, cancelling again while it runs on: a
    cancellation that arrives as an awaited lock or future completes can be absorbed on
    the way (Python 3.11's ``asyncio.wait_for`` returns the result instead), and a single
    ``cancel()`` then waited for forever is how a daemon would hang at exit."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=every_s)
    if not task.cancelled() and task.exception() is not None:
        log.error("%s ended with an error", task.get_name(), exc_info=task.exception())


_RECORDED = ("succeeded", "pending", "failed")  # what a report's recorded outcome can be
_STOP = "stop"  # a claim that gave way to a stop signal, or a server long gone


def _runner_for(config: DaemonConfig, sentinel: Sentinel) -> Runner:
    """The one runner a daemon holds: its own threads, or a warm pool of children read on
    the daemon's loop (the default)."""
    if config.runner == daemon_runners.THREAD:
        return Threads(config.pool.preload)
    return Processes(config.pool, sentinel)


def _burst_wait(look: dict[str, Any] | None, longest_s: float) -> float | None:
    """How long an idle burst daemon's next claim waits, or None to exit. ``look`` is its
    last empty claim answer, sent with nothing running (None: look again at once): a
    retry waiting out its backoff is waited for (the server claims once more as the wait
    ends), no pending work ends the daemon."""
    if look is None:
        return 0.0
    next_in_s = look.get("next_in_s")
    if next_in_s is None:
        return None
    return float(min(max(0.0, float(next_in_s)) + 0.05, longest_s))


class DaemonError(Exception):
    pass


def _transient(response: transport.Answer) -> bool:
    """A refusal worth retrying: the server is overloaded, restarting, or its store is down."""
    return response.status_code == 429 or response.status_code >= 500


def _raise_for(response: transport.Answer) -> None:
    if response.is_success:
        return
    message = refusals.read(response.status_code, response.content).message
    raise DaemonError(f"server refused ({response.status_code}): {message}")
