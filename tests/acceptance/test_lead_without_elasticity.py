"""With elasticity off (``LAKESHORE_ELASTICITY_ENABLED=false``) a real server still takes
the cluster's lead (services/leading.py), so its schedules fire: the schedule loop (as the
retention sweep's, tests/integration/test_retention.py) reads the lead, which the
controller's loop takes when elasticity is on."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.acceptance.conftest import clean_env, running_server
from tests.conftest import BACKENDS, create_pg_database, drop_pg_database

pytestmark = pytest.mark.acceptance

NS = "/v1/namespaces/default"
WITHIN_S = 20.0  # bounded: a slot every second, the lead taken within an interval


@pytest.fixture(params=BACKENDS)
def http(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[httpx.Client]:
    env = clean_env(
        LAKESHORE_ELASTICITY_ENABLED="false",
        LAKESHORE_ELASTICITY_INTERVAL_S="1",
    )
    data_dir, log_path = tmp_path / "data", tmp_path / "server.log"
    db = str(tmp_path / "lakeshore.db")
    made = None
    if request.param == "postgresql":
        made = db = create_pg_database(request.getfixturevalue("pg_server"))
    try:
        with running_server(request.param, db, data_dir, log_path, env) as server:
            headers = {"Authorization": f"Bearer {server.admin_token}"}
            with httpx.Client(base_url=server.url, headers=headers, timeout=30) as client:
                yield client
    finally:
        if made is not None:
            drop_pg_database(request.getfixturevalue("pg_server"), made)


def test_schedules_fire_with_elasticity_off(http: httpx.Client) -> None:
    made = http.post(f"{NS}/queues", json={"name": "lead"})
    assert made.status_code == 201, made.text
    body = {"name": "tick", "every_s": 1, "fn": "m:f", "catch_up": "none"}
    schedule = http.post(f"{NS}/queues/lead/schedules", json=body)
    assert schedule.status_code == 201, schedule.text
    deadline = time.monotonic() + WITHIN_S
    fired = False
    while time.monotonic() < deadline and not fired:
        listed = http.get(f"{NS}/queues/lead/invocations", params={"limit": 100}).json()
        fired = any(i.get("schedule") == "tick" for i in listed["invocations"])
        time.sleep(0.2)
    assert fired, "no slot of the schedule was enqueued"
