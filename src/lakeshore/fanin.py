"""Fan-in: waiting for many invocations at once (``lakeshore.gather``, ``lakeshore.wait``).

A handle's wait is its invocation's end event (:meth:`lakeshore.sdk.Client.ended`), on
the client's one stream connection, so waiting for ten thousand handles opens one
connection, not ten thousand; ``gather`` takes them in order, which costs nothing more
than taking them as they end, as it returns only once all have. ``wait`` with
``FIRST_COMPLETED`` looks at the handles' states instead, round after round, backing off
from 20 ms to 0.5 s between rounds.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Final, Literal

from lakeshore.sdk import FINAL, Handle, outcome

FIRST_COMPLETED: Final = "FIRST_COMPLETED"
ALL_COMPLETED: Final = "ALL_COMPLETED"


def gather(
    handles: Sequence[Handle[Any]],
    *,
    timeout: float | None = None,
    return_exceptions: bool = False,
) -> list[Any]:
    """Each invocation's result, in the handles' order, once all have ended. The first
    failed one's error (in that order) is raised, unless ``return_exceptions``: then it
    takes its place in the list. ``TimeoutError`` once ``timeout`` seconds have gone by
    for them all."""
    deadline = None if timeout is None else time.monotonic() + timeout
    results: list[Any] = []
    for handle in handles:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        results.append(taken(handle.client.ended(handle.id, left), return_exceptions))
    return results


def taken(info: dict[str, Any], return_exceptions: bool) -> Any:
    """An ended invocation's result; its error raised, or returned with
    ``return_exceptions``."""
    try:
        return outcome(info)
    except Exception as exc:
        if not return_exceptions:
            raise
        return exc


def wait(
    handles: Sequence[Handle[Any]],
    *,
    timeout: float | None = None,
    return_when: Literal["FIRST_COMPLETED", "ALL_COMPLETED"] = ALL_COMPLETED,
) -> tuple[list[Handle[Any]], list[Handle[Any]]]:
    """(ended, not ended), each in the handles' order: once all have ended
    (``ALL_COMPLETED``), once any has (``FIRST_COMPLETED``), or after ``timeout``
    seconds, whichever is first. Nothing is raised for a failed invocation."""
    deadline = None if timeout is None else time.monotonic() + timeout
    if return_when == ALL_COMPLETED:
        done: list[Handle[Any]] = []
        for n, handle in enumerate(handles):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                handle.client.ended(handle.id, left)
            except TimeoutError:
                return done, list(handles[n:])
            done.append(handle)
        return done, []
    if return_when != FIRST_COMPLETED:
        raise ValueError(f"return_when must be {FIRST_COMPLETED} or {ALL_COMPLETED}")
    pause = 0.02
    while True:
        ended = {h.id for h in handles if h.state() in FINAL}
        if ended or not handles or (deadline is not None and time.monotonic() >= deadline):
            return [h for h in handles if h.id in ended], [h for h in handles if h.id not in ended]
        wait_s = pause if deadline is None else min(pause, max(0.0, deadline - time.monotonic()))
        time.sleep(wait_s)
        pause = min(pause * 2, 0.5)
