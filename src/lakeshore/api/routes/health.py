"""Liveness and readiness.

``/healthz`` answers while the process serves and its store answers a query (503 when it
does not). ``/readyz`` says whether this replica should be sent traffic: its store
answers, a write can commit there, its schema is at the migration this version ships (a
replica of a newer version migrates at start; an older one must wait), and on PostgreSQL
its listener for the other replicas' wake-ups is connected (without it, waiting claims
hear of new work only on their fallback re-check).

A store that answers reads can still refuse every write: a full disk, a read-only file
or a read-only PostgreSQL. What fails first on a full disk is the write that needs new
space on it, so the probe makes one that does, without growing the store:

- SQLite (WAL): a committed write of the header's ``user_version``, set to the value it
  has. Its commit appends a page to the write-ahead log, as every write's does, and fails
  (``SQLITE_FULL``) where the log cannot grow; the page goes back into the same place of
  the database at the next checkpoint. A write rolled back would not do: in WAL mode its
  pages never leave the cache.
- PostgreSQL: a row put in a temporary table of the connection's own (``ON COMMIT
  DELETE ROWS``, created once per connection) and committed. The first row of an empty
  table extends its file by a page in the database's tablespace, where the data grows,
  and fails (``53100 disk_full``) when it cannot; the commit truncates the file back to
  nothing. A no-op ``UPDATE`` would not do: it rewrites a page already on disk.

The verdict is kept for :data:`WRITABLE_TTL_S` (one probe at a time, however many ask),
so that frequent readiness probes cost one small write every few seconds. A probe that
cannot start within :data:`PROBE_WAIT_S` (the writer is busy) leaves the last verdict
standing: a busy store is not a full one.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from lakeshore import __version__
from lakeshore.api.deps import AppState, State
from lakeshore.errors import StoreUnavailable
from lakeshore.store.engine import Store, head_revision

router = APIRouter(tags=["health"])
log = logging.getLogger("lakeshore.api")
OK = "ok"
WRITABLE_TTL_S = 5.0  # a write probe's verdict is reused this long
PROBE_WAIT_S = 2.0  # a readiness answer waits this long for a probe to end
UNKNOWN = "unknown (the store is unreachable)"


@router.get("/healthz", summary="Health check (no token needed)")
async def healthz(state: State) -> dict[str, Any]:
    await state.store.ping()
    return {"status": "ok", "version": __version__, "database": state.store.dialect}


@router.get(
    "/readyz",
    summary="Readiness: store reachable and writable, schema current, wake-ups heard "
    "(no token needed)",
    responses={503: {"description": "not ready: `checks` says what is not"}},
)
async def readyz(state: State) -> JSONResponse:
    checks = await _checks(state)
    ready = all(value == OK for value in checks.values())
    body = {
        "status": "ready" if ready else "not_ready",
        "version": __version__,
        "database": state.store.dialect,
        "checks": checks,
    }
    return JSONResponse(body, status_code=200 if ready else 503)


async def _checks(state: AppState) -> dict[str, str]:
    checks: dict[str, str] = {}
    try:
        revision = await state.store.schema_revision()
    except (OperationalError, InterfaceError, OSError, StoreUnavailable):
        checks["store"] = "unreachable"
        checks["writes"] = UNKNOWN
        checks["schema"] = UNKNOWN
    else:
        checks["store"] = OK
        checks["writes"] = await probe_of(state).verdict()
        head = head_revision()
        checks["schema"] = (
            OK
            if revision == head
            else f"at revision {revision or 'none'}; this server needs {head}"
        )
    if state.wakeups_listening is not None:
        listening = state.wakeups_listening.is_set()
        checks["wakeups"] = OK if listening else "not listening for other replicas' wake-ups"
    return checks


class WriteProbe:
    """Whether a write commits now: ``write`` tried at most once a ``ttl_s`` of ``clock``
    (seconds), by one caller at a time (the others wait for its verdict, ``wait_s`` at
    most)."""

    def __init__(
        self,
        write: Callable[[], Awaitable[None]],
        clock: Callable[[], float],
        *,
        ttl_s: float = WRITABLE_TTL_S,
        wait_s: float = PROBE_WAIT_S,
    ) -> None:
        self._write, self._clock, self._ttl_s, self._wait_s = write, clock, ttl_s, wait_s
        self._verdict = OK  # the server migrated its store at start: it was writable
        self._at: float | None = None
        self._running: asyncio.Task[str] | None = None

    async def verdict(self) -> str:
        if self._at is not None and 0 <= self._clock() - self._at < self._ttl_s:
            return self._verdict  # (a clock set back asks again)
        if self._running is None:
            self._running = asyncio.create_task(self._probe(), name="lakeshore-write-probe")
        try:
            async with asyncio.timeout(self._wait_s):
                return await asyncio.shield(self._running)
        except TimeoutError:
            return self._verdict  # busy, not full: the last verdict stands

    async def _probe(self) -> str:
        try:
            await self._write()
        except StoreUnavailable:
            pass  # the writer stayed busy: no news about the disk
        except (DBAPIError, OSError) as exc:
            verdict = refusal(exc)
            if verdict is not None:
                self._verdict = verdict
                log.warning("store write probe failed: %s", exc)
        else:
            self._verdict = OK
        finally:
            self._at = self._clock()
            self._running = None
        return self._verdict


_BUSY = ("SQLITE_BUSY", "SQLITE_LOCKED", "55P03", "57014", "40001", "40P01")


def refusal(exc: BaseException) -> str | None:
    """What a failed probe write says, without the driver's message (which can name
    files of the database server); ``None``: the store was busy, which says nothing
    about whether it can write."""
    orig = getattr(exc, "orig", None)
    name = str(getattr(orig, "sqlite_errorname", "") or "")
    sqlstate = str(getattr(orig, "sqlstate", "") or "")
    if name.startswith(_BUSY) or sqlstate in _BUSY:
        return None
    if name == "SQLITE_FULL" or sqlstate == "53100":
        return "not writable: the disk is full"
    if name.startswith("SQLITE_READONLY") or sqlstate == "25006":
        return "not writable: the store is read-only"
    if name.startswith("SQLITE_IOERR") or sqlstate == "58030" or isinstance(exc, OSError):
        return "not writable: I/O error"
    if sqlstate.startswith("53"):
        return "not writable: the database server is out of resources"
    if isinstance(exc, InterfaceError) or (
        isinstance(exc, OperationalError) and not name and not sqlstate
    ):
        return UNKNOWN  # the connection went away: the store check says so next time
    return f"not writable ({name or sqlstate or type(orig or exc).__name__})"


_PROBES: weakref.WeakKeyDictionary[Store, WriteProbe] = weakref.WeakKeyDictionary()


def probe_of(state: AppState) -> WriteProbe:
    """The write probe of this server's store (one per store, kept as long as the
    store), timed by the server's clock."""
    store = state.store
    probe = _PROBES.get(store)
    if probe is None:
        probe = _PROBES[store] = WriteProbe(
            lambda: _write_probe(store), lambda: state.clock().timestamp()
        )
    return probe


_PG_PROBE_TABLE = (
    "CREATE TEMPORARY TABLE IF NOT EXISTS lakeshore_write_probe (filler bytea) "
    "ON COMMIT DELETE ROWS"
)


async def _write_probe(store: Store) -> None:
    async with store.write() as conn:
        if store.dialect == "sqlite":
            value = (await conn.exec_driver_sql("PRAGMA user_version")).scalar_one()
            await conn.exec_driver_sql(f"PRAGMA user_version = {int(value)}")
        else:
            await conn.execute(text(_PG_PROBE_TABLE))
            await conn.execute(text("INSERT INTO lakeshore_write_probe VALUES ('')"))
