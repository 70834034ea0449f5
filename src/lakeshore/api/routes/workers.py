"""Worker daemons: hello, long-poll claim, heartbeat, complete, fail."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Body, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from lakeshore.api import lean
from lakeshore.api.answers import json_answer
from lakeshore.api.deps import Caller, State
from lakeshore.domain import jsonsafe
from lakeshore.domain.invocations import Report
from lakeshore.errors import InvalidInput, PayloadTooLarge
from lakeshore.services.taskqueue import streams as stream_service
from lakeshore.services.taskqueue import workers as worker_service
from lakeshore.services.taskqueue.notify import AfterBursts, Hangup, HangupWatch

router = lean.Router(prefix="/v1/workers", tags=["workers"])
# the memory a burst of claims held goes back to the system once the burst has ended
after_bursts = AfterBursts()


class ClaimIn(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    timeout_s: Annotated[float, Field(ge=0, le=3600)] | None = None
    max: Annotated[int, Field(ge=0, le=10_000)] | None = None


class ErrorIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Annotated[str, Field(max_length=256)] = "Error"
    message: Annotated[str, Field(max_length=65536)] = ""
    traceback: Annotated[str, Field(max_length=262144)] | None = None


class FailIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    error: ErrorIn
    retry: bool = True


@router.post("/hello", summary="Register or refresh a worker")
async def hello(state: State, caller: Caller, body: Annotated[Any, Body()]) -> dict[str, Any]:
    return await worker_service.hello(
        state.store, caller, body, state.clock(), lease_s=state.settings.lease_s
    )


@router.post(
    "/{worker_id}/claim",
    summary="Long-poll for invocations (at most 20 s)",
    response_model=dict[str, Any],
)
async def claim(
    worker_id: str, request: Request, state: State, caller: Caller, body: ClaimIn | None = None
) -> Response:
    """Up to ``max`` (default: the worker's capacity) invocations as soon as any is
    claimable, or none after ``timeout_s`` (at most 20 s). An empty answer carries
    ``next_in_s``: the seconds until pending work in the worker's queues may be claimed
    (0 when it already may, e.g. another worker took it first; more when a retry waits
    out its backoff), or null when they hold no pending work."""
    wanted = body or ClaimIn()
    # set on the client's hang-up (watched without a task of its own) or as the server
    # begins to stop (it sets every claim's in ``state.hangups``): a waiting claim then
    # answers at once, empty
    gone = Hangup()
    if state.stopping.is_set():
        gone.set()
    state.hangups.add(gone)
    after_bursts.count(len(state.hangups))
    watcher = HangupWatch(request.receive, gone)
    try:
        claimed = await worker_service.claim(
            state.store,
            state.notifier,
            caller,
            worker_id,
            timeout_s=wanted.timeout_s,
            max_count=wanted.max,
            clock=state.clock,
            lease_s=state.settings.lease_s,
            recheck_s=state.settings.claim_recheck_s,
            gone=gone,
            metrics=state.metrics,
            waiting=state.waiting,
        )
    finally:
        watcher.close()
        state.hangups.discard(gone)
        after_bursts.count(len(state.hangups))
    if claimed:
        return json_answer({"invocations": claimed})
    # nothing now: when pending work will be claimable (a retry's backoff), or null
    next_in_s = await worker_service.next_claimable_in_s(
        state.store, caller, worker_id, state.clock()
    )
    return json_answer({"invocations": claimed, "next_in_s": next_in_s})


@router.post("/{worker_id}/bye", summary="Leave: hand back what the worker holds")
async def bye(worker_id: str, state: State, caller: Caller) -> dict[str, Any]:
    return await worker_service.bye(state.store, state.notifier, caller, worker_id, state.clock())


class HeartbeatCapabilities(BaseModel):
    """What a heartbeat may update of the worker's hello capabilities."""

    model_config = ConfigDict(extra="forbid", strict=True)
    current_invocations: Annotated[int, Field(strict=True, ge=0, le=2**31 - 1)] | None = None


Ids = Annotated[
    list[Annotated[jsonsafe.StorableText, Field(max_length=64)]], Field(max_length=10_000)
]


class HeartbeatIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    running: Ids | None = None
    prefetched: Ids | None = None
    capabilities: HeartbeatCapabilities | None = None


@router.post("/{worker_id}/heartbeat", summary="Extend the leases the worker holds")
async def heartbeat(
    worker_id: str, state: State, caller: Caller, body: HeartbeatIn | None = None
) -> dict[str, Any]:
    """With ``running`` (the ids the daemon has begun) and ``prefetched`` (those it holds
    waiting for a free slot), only those leases are extended, the ``running`` ones are
    recorded as begun, and what the worker holds without listing it (claimed over a
    lease ago) goes back to its queue; without ``running``, every lease the worker holds
    is extended (and counts as begun). Should the worker die without a word, only the
    begun ones are charged an attempt when their leases run out. With
    ``capabilities.current_invocations`` the worker's report of what it runs is updated
    (``null`` withdraws it), as at hello: the controller reads it for scale-down."""
    reported = body.capabilities if body is not None else None
    current: int | worker_service.Unchanged | None = worker_service.UNCHANGED
    if reported is not None and "current_invocations" in reported.model_fields_set:
        current = reported.current_invocations
    return await worker_service.heartbeat(
        state.store,
        state.notifier,
        caller,
        worker_id,
        state.clock(),
        lease_s=state.settings.lease_s,
        running=None if body is None else body.running,
        prefetched=None if body is None else body.prefetched,
        current_invocations=current,
    )


class CrashedIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    started: Ids = Field(default_factory=list)
    session: Annotated[str, Field(min_length=1, max_length=64)] | None = None


@router.post("/{worker_id}/crashed", summary="A daemon died: charge what it began, return the rest")
async def crashed(
    worker_id: str, state: State, caller: Caller, body: CrashedIn | None = None
) -> dict[str, Any]:
    """Sent by a daemon's sentinel when the daemon dies (``kill -9`` included), with the
    daemon's token. The invocations the worker holds that had begun (``started``, and
    those its heartbeats listed as running) are charged their attempt — back to pending
    after their backoff, or ``failed`` (``WorkerCrashed``) once their attempts are
    spent — and the rest return to their queues at once, their attempt uncounted. The
    worker row then goes, as after a bye, unless ``session`` is not the one its last
    hello named (a successor with the same id said hello since; it keeps its row and its
    leases) → ``{retried, failed, released, gone}``."""
    wanted = body or CrashedIn()
    return await worker_service.crashed(
        state.store,
        state.notifier,
        caller,
        worker_id,
        started=wanted.started,
        session=wanted.session,
        now=state.clock(),
        metrics=state.metrics,
    )


@router.post("/{worker_id}/invocations/{invocation_id}/complete", summary="Succeed an invocation")
async def complete(
    worker_id: str,
    invocation_id: str,
    state: State,
    caller: Caller,
    body: Annotated[dict[str, Any], Body()],
) -> dict[str, Any]:
    if set(body) - {"result"}:
        raise InvalidInput('complete takes {"result": <JSON>}', field="result")
    result = jsonsafe.require_storable(body.get("result"), "result")
    jsonsafe.require_within(
        result,
        state.settings.max_result_bytes,
        "the result",
        setting="LAKESHORE_MAX_RESULT_BYTES",
        field="result",
    )
    return await worker_service.complete(
        state.store,
        state.notifier,
        caller,
        worker_id,
        invocation_id,
        result,
        state.clock(),
        metrics=state.metrics,
    )


@router.post("/{worker_id}/invocations/{invocation_id}/fail", summary="Fail an attempt")
async def fail(
    worker_id: str, invocation_id: str, state: State, caller: Caller, body: FailIn
) -> dict[str, Any]:
    error = jsonsafe.require_storable(body.error.model_dump(exclude_none=True), "error")
    return await worker_service.fail(
        state.store,
        state.notifier,
        caller,
        worker_id,
        invocation_id,
        error,
        retry=body.retry,
        now=state.clock(),
        metrics=state.metrics,
    )


class ReportItemIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    id: Annotated[jsonsafe.StorableText, Field(min_length=1, max_length=64)]
    result: Any = None
    error: ErrorIn | None = None
    retry: bool = True


class ReportIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    results: Annotated[list[ReportItemIn], Field(max_length=1000)]
    claim: Annotated[int, Field(ge=0, le=10_000)] = 0


@router.post(
    "/{worker_id}/results",
    summary="Report many outcomes, then claim more",
    response_model=dict[str, Any],
)
async def report(worker_id: str, state: State, caller: Caller, body: ReportIn) -> Response:
    """Each item is ``{"id", "result"}`` (succeeded) or ``{"id", "error", "retry"}`` (a
    failed attempt), recorded in one transaction if the worker still holds it; the answer
    gives each its new ``state``, or ``refused`` (``not_held``, ``too_large``,
    ``invalid``) with a message. With ``claim`` > 0, up to that many more invocations are
    leased at once (no waiting) and returned in ``invocations``."""
    reports: list[Report] = []
    refused: dict[str, dict[str, str]] = {}
    seen: set[str] = set()
    for n, item in enumerate(body.results):
        if item.id in seen:
            raise InvalidInput(f'invocation "{item.id}" is reported twice', field=f"results[{n}]")
        seen.add(item.id)
        if item.error is not None:
            if "result" in item.model_fields_set:
                raise InvalidInput(
                    "an item has a result or an error, not both", field=f"results[{n}]"
                )
            error = jsonsafe.require_storable(item.error.model_dump(exclude_none=True), "error")
            reports.append(Report(item.id, error=error, retry=item.retry))
            continue
        try:
            result = jsonsafe.require_storable(item.result, f"results[{n}].result")
            jsonsafe.require_within(
                result,
                state.settings.max_result_bytes,
                "the result",
                setting="LAKESHORE_MAX_RESULT_BYTES",
                field=f"results[{n}].result",
            )
        except PayloadTooLarge as exc:
            refused[item.id] = {"refused": "too_large", "message": str(exc)}
        except InvalidInput as exc:
            refused[item.id] = {"refused": "invalid", "message": str(exc)}
        else:
            reports.append(Report(item.id, result=result))
    answer = await worker_service.report(
        state.store,
        state.notifier,
        caller,
        worker_id,
        reports,
        refused,
        claim=body.claim,
        now=state.clock(),
        lease_s=state.settings.lease_s,
        metrics=state.metrics,
    )
    return json_answer(answer)


@router.post(
    "/{worker_id}/invocations/{invocation_id}/stream",
    summary="Append items a generator UDF yielded (numbered from `seq`)",
)
async def append_stream(
    worker_id: str,
    invocation_id: str,
    state: State,
    caller: Caller,
    body: Annotated[dict[str, Any], Body()],
) -> dict[str, Any]:
    seq, items = body.get("seq"), body.get("items")
    if set(body) - {"seq", "items"} or not isinstance(items, list):
        raise InvalidInput('append takes {"seq": <first number>, "items": [<JSON>, …]}')
    if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq < 2**31 - 1_000:
        raise InvalidInput("seq is the number of the first item, from 0", field="seq")
    for i, item in enumerate(jsonsafe.require_storable(items, "items")):
        jsonsafe.require_within(
            item,
            state.settings.max_result_bytes,
            f"item {seq + i}",
            setting="LAKESHORE_MAX_RESULT_BYTES",
            field=f"items[{i}]",
        )
    worker = await worker_service.holder(state.store, caller, worker_id)
    return await stream_service.append(
        state.store, state.notifier, worker, invocation_id, seq, items, state.clock()
    )
