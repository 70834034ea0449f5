"""Backing off between tries: one home for the waits of every client loop (tenacity).

The SDK's and the async client's stream reconnects, the daemon's reports and streamed
items, its hello and its claims wait between tries here: exponentially widening bounds
(``first_s``, twice that, … up to ``max_s``) with *full jitter* — each wait drawn
uniformly below its bound (tenacity's ``wait_random_exponential``), so daemons that lost
the server together do not come back together. It is the same rule an invocation's own
retries follow (:mod:`lakeshore.domain.retry`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_base,
    retry_if_exception,
    retry_if_exception_type,
    retry_if_result,
    stop_after_attempt,
    stop_never,
    wait_random_exponential,
)


def wait(first_s: float, max_s: float) -> wait_random_exponential:
    """The waits: below ``first_s``, twice that, … up to ``max_s``."""
    return wait_random_exponential(multiplier=first_s, max=max_s)


def pause_s(failures: int, first_s: float, max_s: float) -> float:
    """The wait after ``failures`` in a row, by the same rule (:func:`wait`), for a loop
    that goes on after it (the daemon's claims) rather than one that ends at a success."""
    state = RetryCallState(None, None, (), {})  # type: ignore[arg-type]
    state.attempt_number = max(1, failures)
    return float(wait(first_s, max_s)(state))


Failure = type[BaseException] | tuple[type[BaseException], ...] | Callable[[BaseException], bool]


def _retry(on: Failure, again: Callable[[Any], bool] | None) -> retry_base:
    tried: retry_base = (
        retry_if_exception_type(on) if isinstance(on, (type, tuple)) else retry_if_exception(on)
    )
    return tried if again is None else tried | retry_if_result(again)


def retrying(
    on: Failure,
    *,
    tries: int | None,
    first_s: float = 0.1,
    max_s: float = 2.0,
) -> Retrying:
    """Blocking tries: again after an ``on`` error, up to ``tries`` in all (``None``: no
    end); the last error is raised."""
    return Retrying(
        retry=_retry(on, None),
        stop=stop_never if tries is None else stop_after_attempt(tries),
        wait=wait(first_s, max_s),
        reraise=True,
    )


def aretrying(
    on: Failure,
    *,
    tries: int | None,
    first_s: float = 0.1,
    max_s: float = 2.0,
    again: Callable[[Any], bool] | None = None,
    give_up: Callable[[RetryCallState], Any] | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> AsyncRetrying:
    """Tries on the event loop: again after an ``on`` error (its types, or a predicate of
    the error) or a result ``again`` says to try again, up to ``tries`` in all; then
    ``give_up``'s value (without it the last error is raised). ``sleep`` waits (one a
    stop can cut short)."""
    return AsyncRetrying(
        retry=_retry(on, again),
        stop=stop_never if tries is None else stop_after_attempt(tries),
        wait=wait(first_s, max_s),
        sleep=sleep,
        reraise=give_up is None,
        retry_error_callback=give_up,
    )
