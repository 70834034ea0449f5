"""``lakeshore up``'s local fleet: the ``local`` provider registered at start, the daemons an
earlier ``lakeshore up`` on the same data dir launched adopted (so ``max_daemons`` still
counts them), and every daemon stopped at shutdown (so none is left behind)."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from pathlib import Path
from typing import Any

from lakeshore.errors import Conflict
from lakeshore.providers import local
from lakeshore.services import auth
from lakeshore.services import namespaces as ns_service
from lakeshore.services.fleet import providers as provider_service
from lakeshore.store import launches as launch_store
from lakeshore.store import providers as provider_store
from lakeshore.store.engine import Store

log = logging.getLogger("lakeshore.local")

PROVIDER_NAME = "local"
STOP_GRACE_S = 10.0


async def ensure_provider(
    store: Store, working_dir: Path, now: datetime, code_dir: Path | None = None
) -> None:
    """Register the ``local`` provider in the default namespace unless it exists, and adopt
    the live daemons an earlier server process launched. ``code_dir`` (``lakeshore up``'s
    working directory) is where its daemons import UDF modules from; a provider kept from
    an earlier start keeps its config, but takes this start's ``code_dir``."""
    ns = await ns_service.resolve(store, auth.ADMIN, ns_service.DEFAULT_NAMESPACE)
    config: dict[str, Any] = {"working_dir": str(working_dir)}
    if code_dir is not None:
        config["code_dir"] = str(code_dir)
    body = {"name": PROVIDER_NAME, "kind": "local", "config": config}
    try:
        await provider_service.create(store, auth.ADMIN, ns, body, now)
    except Conflict:  # kept from an earlier start (its config too)
        if code_dir is not None:
            await _move_code_dir(store, ns.id, code_dir, now)
    await adopt_running(store)


async def _move_code_dir(store: Store, namespace_id: str, code_dir: Path, now: datetime) -> None:
    async with store.write() as conn:
        row = await provider_store.get(conn, namespace_id, PROVIDER_NAME)
        if row is None or row["kind"] != "local" or row["config"].get("code_dir") == str(code_dir):
            return
        config = {**row["config"], "code_dir": str(code_dir)}
        await provider_store.set_config(conn, namespace_id, PROVIDER_NAME, config, now)


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
