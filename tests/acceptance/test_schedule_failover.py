"""A schedule across a leader failover, through real processes on PostgreSQL: two server
replicas, a schedule every 2 s with ``catch_up: all``, the leader killed with SIGKILL and
restarted: every slot is enqueued exactly once, none missing."""

from __future__ import annotations

import secrets
import signal
import subprocess
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.conftest import WIDE, _spawn, _stop, clean_env
from tests.acceptance.test_controller_process import NS, connect, tick_status, wait_for
from tests.conftest import create_pg_database, drop_pg_database

pytestmark = pytest.mark.acceptance

EVERY_S = 2
Started = tuple[subprocess.Popen[bytes], str]


def expected_keys(created_at: str, last_slot: str) -> list[str]:
    """The keys of every slot after the schedule's creation up to its last slot."""
    start = datetime.fromisoformat(created_at)
    end = datetime.fromisoformat(last_slot.replace("Z", "+00:00"))
    slot = datetime.fromtimestamp((start.timestamp() // EVERY_S + 1) * EVERY_S, start.tzinfo)
    keys = []
    while slot <= end:
        keys.append(f"schedule:beat:{slot.isoformat().replace('+00:00', 'Z')}")
        slot += timedelta(seconds=EVERY_S)
    return keys


def test_every_slot_is_enqueued_once_across_a_killed_and_restarted_leader(
    pg_server: str, tmp_path: Path
) -> None:
    token = f"lks-{secrets.token_hex(16)}"  # one admin token for every replica
    env = clean_env(COLUMNS=WIDE, ELASTICITY_ENABLED="true", ELASTICITY_INTERVAL_S="0.5")
    env["LAKESHORE_ADMIN_TOKEN"] = token
    db_url = create_pg_database(pg_server)
    starts: list[Future[Started]] = []

    def start(name: str) -> Future[Started]:
        starts.append(pool.submit(_spawn, db_url, tmp_path / name, tmp_path / f"{name}.log", env))
        return starts[-1]

    pool = ThreadPoolExecutor(2)
    try:
        # the two replicas start side by side (their migrations take turns on a lock)
        replicas = [start("a"), start("b")]
        urls = dict((url, process) for process, url in (f.result() for f in replicas))
        first = next(iter(urls))
        with connect(first, token) as http:
            assert http.post(f"{NS}/queues", json={"name": "ticks"}).status_code == 201
            body = {"name": "beat", "every_s": EVERY_S, "fn": "tests.udfs:noop", "catch_up": "all"}
            made = http.post(f"{NS}/queues/ticks/schedules", json=body)
            assert made.status_code == 201, made.text
            created_at = made.json()["created_at"]

        def records(url: str) -> list[dict[str, Any]]:
            with connect(url, token) as http:
                listed = http.get(f"{NS}/queues/ticks/invocations", params={"limit": 1000})
            found: list[dict[str, Any]] = listed.json()["invocations"]
            return found

        wait_for(lambda: len(records(first)) >= 2, 20, "the first two slots", every_s=0.2)

        def one_leader() -> dict[str, int] | None:
            codes = {url: tick_status(url, token) for url in urls}
            return codes if sorted(codes.values()) == [200, 409] else None

        codes = wait_for(one_leader, 20, "exactly one leader", every_s=0.25)
        [leader] = [url for url, code in codes.items() if code == 200]
        [survivor] = [url for url in urls if url != leader]
        urls[leader].send_signal(signal.SIGKILL)
        urls[leader].wait(timeout=10)
        restarted = start("back")  # the killed leader comes back, on the same store
        seen_at_kill = len(records(survivor))
        wait_for(lambda: len(records(survivor)) >= seen_at_kill + 3, 20, "slots after the kill")
        restarted.result()
        with connect(survivor, token) as http:
            paused = http.patch(f"{NS}/queues/ticks/schedules/beat", json={"enabled": False})
        assert paused.status_code == 200, paused.text
        # the record names its schedule and slot too (written just after its submit)
        found = wait_for(
            lambda: (got := records(survivor)) and all("slot" in i for i in got) and got,
            10,
            "every invocation's slot",
        )
        keys = [i["key"] for i in found]
        assert sorted(keys) == expected_keys(created_at, paused.json()["last_slot"])
        assert len(keys) == len(set(keys))
        for invocation in found:
            slot = invocation["slot"].replace("+00:00", "Z")
            assert invocation["key"] == f"schedule:{invocation['schedule']}:{slot}"
    finally:
        pool.shutdown(wait=True)
        for future in starts:
            if future.exception() is None:
                _stop(future.result()[0])
        drop_pg_database(pg_server, db_url)
