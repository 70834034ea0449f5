"""Lakeshore: a control plane for elastic queues.

The SDK's names (``udf``, ``Client``, ``Handle``, ``RemoteError``, ``gather``, ``wait``,
and from asyncio ``AsyncClient``, ``AsyncHandle``, ``agather``) are loaded on first use,
so a process that needs only a small part of the package (a daemon's sentinel, the CLI's
``--help``) does not pay for the HTTP client's imports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lakeshore.async_client import AsyncClient, AsyncHandle, agather
    from lakeshore.fanin import ALL_COMPLETED, FIRST_COMPLETED, gather, wait
    from lakeshore.sdk import Client, Handle, RemoteError, udf

__version__ = "0.1.0"
__all__ = [
    "ALL_COMPLETED",
    "FIRST_COMPLETED",
    "AsyncClient",
    "AsyncHandle",
    "Client",
    "Handle",
    "RemoteError",
    "__version__",
    "agather",
    "gather",
    "udf",
    "wait",
]

_SDK = frozenset({"Client", "Handle", "RemoteError", "udf"})
_FANIN = frozenset({"ALL_COMPLETED", "FIRST_COMPLETED", "gather", "wait"})
_ASYNC = frozenset({"AsyncClient", "AsyncHandle", "agather"})


def __getattr__(name: str) -> Any:
    if name in _SDK:
        return getattr(importlib.import_module("lakeshore.sdk"), name)
    if name in _ASYNC:
        return getattr(importlib.import_module("lakeshore.async_client"), name)
    if name in _FANIN:
        return getattr(importlib.import_module("lakeshore.fanin"), name)
    raise AttributeError(f"module 'lakeshore' has no attribute {name!r}")
