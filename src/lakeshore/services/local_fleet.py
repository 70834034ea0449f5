"""``lakeshore up``'s local fleet: the ``local`` provider registered at start, the daemons an
earlier ``lakeshore up`` on the same data dir launched adopted (so ``max_daemons`` still
counts them), and every daemon stopped at shutdown (so none is left behind)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import datetime
from pathlib import Path

from lakeshore.errors import Conflict
from lakeshore.providers import local
from lakeshore.services import auth
from lakeshore.services import namespaces as ns_service
from lakeshore.services import providers as provider_service
from lakeshore.store import launches as launch_store
from lakeshore.store.engine import Store

log = logging.getLogger("lakeshore.local")

PROVIDER_NAME = "local"
STOP_GRACE_S = 10.0


async def ensure_provider(store: Store, working_dir: Path, now: datetime) -> None:
    """Register the ``local`` provider in the default namespace unless it exists, and adopt
    the live daemons an earlier server process launched."""
    ns = await ns_service.resolve(store, auth.ADMIN, ns_service.DEFAULT_NAMESPACE)
    body = {"name": PROVIDER_NAME, "kind": "local", "config": {"working_dir": str(working_dir)}}
    with contextlib.suppress(Conflict):  # kept from an earlier start (its config too)
        await provider_service.create(store, auth.ADMIN, ns, body, now)
    await adopt_running(store)


async def adopt_running(store: Store) -> int:
    """Count the still-running daemons of every ``local`` provider's launches (started by
    an earlier server process: a restart, or a crash) among their provider's live daemons,
    so ``max_daemons`` holds across restarts. Returns how many were adopted."""
    async with store.read() as conn:
        rows = await launch_store.live_on(conn, "local")
    adopted = sum(local.adopt(row["provider_name"], row["handle"]) for row in rows)
    if adopted:
        log.info("found %d local daemon(s) launched before this start", adopted)
    return adopted


async def stop_all(store: Store, now: datetime) -> int:
    """Stop every daemon a ``local`` provider started and nobody stopped yet."""
    async with store.read() as conn:
        rows = await launch_store.live_on(conn, "local")
    running = [row for row in rows if local.alive(row["handle"])]
    if running:
        log.info("stopping %d local daemon(s)", len(running))
    await asyncio.gather(*(local.stop(row["handle"], grace_s=STOP_GRACE_S) for row in running))
    async with store.write() as conn:
        for row in rows:
            await launch_store.terminated(conn, row["id"], now)
    return len(running)
