"""Custom scalers (``customScalerUdf``): only functions the operator installed and allowed.

A namespace token must not be able to make the server run arbitrary code, so a queue may
name a scaler only if it is allowed here: listed in ``LAKESHORE_ALLOWED_SCALERS`` (import
paths, comma-separated) or published by an installed package under the entry-point group
``lakeshore.scalers``. Anything else is refused when the queue is written (422).

A scaler is called as ``scaler(signals)`` with a dict of the tick's signals
(``daemon_count``, ``utilization``, ``pending``, ``in_flight``), in a thread of a small pool
of the scalers' own (so a hung scaler never takes a thread the providers' clients need); it
answers an action string or ``{"action": …, "reason": …}``. Its exceptions, and an answer
that does not come within the controller's time-out, become a ``tick_noop`` naming the
failure. A call that timed out may still be running: until it ends, that queue's scaler is
not called again (the tick is a ``tick_noop`` saying so), so a hung scaler holds one thread,
not one more each tick.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Hashable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from importlib.metadata import entry_points
from typing import Any, Final

from lakeshore.domain.scaling import Signals
from lakeshore.errors import InvalidInput

ENTRY_POINT_GROUP: Final = "lakeshore.scalers"
THREADS: Final = 4  # scalers answering at once, across every queue


class ScalerError(Exception):
    """The scaler could not be called, raised, or did not answer in time."""


def installed() -> set[str]:
    """Import paths published under the ``lakeshore.scalers`` entry-point group."""
    return {ep.value.replace(" ", "") for ep in entry_points(group=ENTRY_POINT_GROUP)}


class Registry:
    def __init__(self, allowed: Iterable[str] = ()) -> None:
        self.allowed = {path.strip() for path in allowed if path.strip()} | installed()
        self._pool: ThreadPoolExecutor | None = None
        self._running: dict[Hashable, Future[Any]] = {}  # a call per key at most

    def check(self, path: str | None) -> None:
        """422 for a queue naming a scaler this server does not allow."""
        if path is not None and path not in self.allowed:
            listed = ", ".join(sorted(self.allowed)) or "none"
            raise InvalidInput(
                f'customScalerUdf "{path}" is not a scaler this server allows '
                f"(allowed: {listed}; see LAKESHORE_ALLOWED_SCALERS and the "
                f'"{ENTRY_POINT_GROUP}" entry points)',
                field="customScalerUdf",
            )

    async def call(self, path: str, s: Signals, *, timeout_s: float, key: Hashable = None) -> Any:
        """The scaler's answer; ``key`` (the queue or pool) is not called again while an
        earlier call for it still runs."""
        earlier = self._running.get((key, path))
        if earlier is not None and not earlier.done():
            raise ScalerError(f"{path} is still running from an earlier tick")
        if path not in self.allowed:
            raise ScalerError(f"{path} is not an allowed scaler on this server")
        try:
            module_name, _, qualname = path.partition(":")
            target: Any = importlib.import_module(module_name)
            for part in qualname.split("."):
                target = getattr(target, part)
        except Exception as exc:
            raise ScalerError(f"cannot import {path}: {exc}") from exc
        arguments = {
            "daemon_count": s.daemon_count,
            "utilization": s.utilization,
            "pending": s.pending,
            "in_flight": s.in_flight,
        }
        if self._pool is None:
            self._pool = ThreadPoolExecutor(THREADS, thread_name_prefix="lakeshore-scaler")
        future = self._pool.submit(target, arguments)
        self._running[(key, path)] = future
        future.add_done_callback(lambda done: self._forget((key, path), done))
        try:
            async with asyncio.timeout(timeout_s):
                return await asyncio.wrap_future(future)
        except TimeoutError:
            raise ScalerError(f"{path} did not answer within {timeout_s:g} s") from None
        except Exception as exc:
            raise ScalerError(f"{path} raised {type(exc).__name__}: {exc}") from exc

    def _forget(self, key: Hashable, done: Future[Any]) -> None:
        if self._running.get(key) is done:
            del self._running[key]

    def close(self) -> None:
        """Let go of the scalers' threads (a hung scaler's thread ends when it returns)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
