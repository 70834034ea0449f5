"""A schedule across a leader failover, through real processes on PostgreSQL: two server
replicas, a schedule every 2 s with ``catch_up: all``, the leader killed with SIGKILL and
restarted: every slot is enqueued exactly once, none missing."""

from __future__ import annotations

import signal
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from tests.acceptance.conftest import WIDE, _spawn, _stop, clean_env, running_server
from tests.acceptance.test_controller_process import NS, connect, tick_status, wait_for
from tests.conftest import create_pg_database, drop_pg_database

pytestmark = pytest.mark.acceptance

EVERY_S = 2


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
    env = clean_env(COLUMNS=WIDE, ELASTICITY_ENABLED="true", ELASTICITY_INTERVAL_S="0.5")
    db_url = create_pg_database(pg_server)
    processes = []
    try:
        with running_server("postgresql", db_url, tmp_path / "a", tmp_path / "a.log", env) as a:
            token = a.admin_token
            env_b = {**env, "LAKESHORE_ADMIN_TOKEN": token}
            b_process, b_url = _spawn(db_url, tmp_path / "b", tmp_path / "b.log", env_b)
            processes.append(b_process)
            urls = {a.url: a.process, b_url: b_process}
            with connect(a.url, token) as http:
                assert http.post(f"{NS}/queues", json={"name": "ticks"}).status_code == 201
                body = {
                    "name": "beat",
                    "every_s": EVERY_S,
                    "fn": "tests.udfs:noop",
                    "catch_up": "all",
                }
                made = http.post(f"{NS}/queues/ticks/schedules", json=body)
                assert made.status_code == 201, made.text
                created_at = made.json()["created_at"]

                def records() -> list[dict[str, str]]:
                    listed = http.get(f"{NS}/queues/ticks/invocations", params={"limit": 1000})
                    found: list[dict[str, str]] = listed.json()["invocations"]
                    return found

                def enqueued() -> list[str]:
                    return [i["key"] for i in records()]

                wait_for(lambda: len(enqueued()) >= 2, 20, "the first two slots", every_s=0.2)

            def one_leader() -> dict[str, int] | None:
                codes = {url: tick_status(url, token) for url in urls}
                return codes if sorted(codes.values()) == [200, 409] else None

            codes = wait_for(one_leader, 20, "exactly one leader", every_s=0.25)
            [leader] = [url for url, code in codes.items() if code == 200]
            [survivor] = [url for url in urls if url != leader]
            urls[leader].send_signal(signal.SIGKILL)
            urls[leader].wait(timeout=10)
            # the killed leader comes back as a third process, on the same store
            back_dir = tmp_path / "back"
            c_process, _ = _spawn(db_url, back_dir, tmp_path / "c.log", env_b)
            processes.append(c_process)

            with connect(survivor, token) as http:
                seen_at_kill = len(enqueued())
                wait_for(
                    lambda: len(enqueued()) >= seen_at_kill + 3, 20, "three slots after the kill"
                )
                paused = http.patch(f"{NS}/queues/ticks/schedules/beat", json={"enabled": False})
                assert paused.status_code == 200, paused.text
                last_slot = paused.json()["last_slot"]
                keys = enqueued()
            assert sorted(keys) == expected_keys(created_at, last_slot)
            assert len(keys) == len(set(keys))
            # each record names its schedule and slot (written just after its submit)
            with connect(survivor, token) as http:
                marked = wait_for(
                    lambda: all("slot" in i for i in records()) and records(), 10, "the slots"
                )
            for made in marked:
                slot = made["slot"].replace("+00:00", "Z")
                assert made["key"] == f"schedule:{made['schedule']}:{slot}", made
    finally:
        for process in processes:
            _stop(process)
        drop_pg_database(pg_server, db_url)
