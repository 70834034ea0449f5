"""Custom scalers (``customScalerUdf``): only functions the operator installed and allowed.

A namespace token must not be able to make the server run arbitrary code, so a queue may
name a scaler only if it is allowed here: listed in ``LAKESHORE_ALLOWED_SCALERS`` (import
paths, comma-separated) or published by an installed package under the entry-point group
``lakeshore.scalers``. Anything else is refused when the queue is written (422).

A scaler is called in a worker thread as ``scaler(signals)`` with a dict of the tick's
signals (``daemon_count``, ``utilization``, ``pending``, ``in_flight``); it answers an action
string or ``{"action": …, "reason": …}``. Its exceptions, and an answer that does not come
within the controller's time-out, become a ``tick_noop`` naming the failure.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Iterable
from importlib.metadata import entry_points
from typing import Any, Final

from lakeshore.domain.scaling import Signals
from lakeshore.errors import InvalidInput

ENTRY_POINT_GROUP: Final = "lakeshore.scalers"


class ScalerError(Exception):
    """The scaler could not be called, raised, or did not answer in time."""


def installed() -> set[str]:
    """Import paths published under the ``lakeshore.scalers`` entry-point group."""
    return {ep.value.replace(" ", "") for ep in entry_points(group=ENTRY_POINT_GROUP)}


class Registry:
    def __init__(self, allowed: Iterable[str] = ()) -> None:
        self.allowed = {path.strip() for path in allowed if path.strip()} | installed()

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

    async def call(self, path: str, s: Signals, *, timeout_s: float) -> Any:
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
        try:
            return await asyncio.wait_for(asyncio.to_thread(target, arguments), timeout_s)
        except TimeoutError:
            raise ScalerError(f"{path} did not answer within {timeout_s:g} s") from None
        except Exception as exc:
            raise ScalerError(f"{path} raised {type(exc).__name__}: {exc}") from exc
