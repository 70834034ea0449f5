"""Retention in a real ``lakeshore server`` (SQLite and PostgreSQL): with a small window,
its own loop deletes finished invocations and frees their keys, and counts it in
``/metrics``; the CLI sets and shows a queue's ``retention_s``, and ``apply`` writes it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.acceptance.conftest import Cli, LakeshoreServer, clean_env, running_server

pytestmark = pytest.mark.acceptance

NS = "/v1/namespaces/default"
GONE_WITHIN_S = 30.0  # a generous bound for a loaded machine; it takes about a second


@pytest.fixture(params=["sqlite", "postgresql"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LakeshoreServer]:
    """A server sweeping every 0.2 s, with the elasticity loop off (nothing to scale)."""
    env = clean_env(LAKESHORE_RETENTION_INTERVAL_S="0.2", LAKESHORE_ELASTICITY_ENABLED="false")
    data_dir, log = tmp_path / "data", tmp_path / "server.log"
    if request.param == "sqlite":
        db = str(tmp_path / "lakeshore.db")
    else:
        db = request.getfixturevalue("fresh_pg_url")
    with running_server(request.param, db, data_dir, log, env) as srv:
        yield srv


@pytest.fixture
def http(server: LakeshoreServer) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {server.admin_token}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as client:
        yield client


def submit(http: httpx.Client, queue: str, key: str) -> httpx.Response:
    return http.post(f"{NS}/queues/{queue}/invocations", json={"fn": "m:f", "key": key})


def test_a_short_retention_removes_finished_invocations_and_frees_their_key(
    server: LakeshoreServer, http: httpx.Client, tmp_path: Path
) -> None:
    cli = Cli(server.url, server.admin_token, tmp_path / "cli")
    (tmp_path / "cli").mkdir()
    made = cli.run("queues", "create", "brief", "--retention-s", "1")
    assert made.returncode == 0, made.stderr
    shown = cli.run("queues", "show", "brief", "--json").json()
    assert shown["retention_s"] == 1
    first = submit(http, "brief", "report-2026-12-07")
    assert first.status_code == 201, first.text
    first_id = first.json()["id"]
    assert http.post(f"{NS}/invocations/{first_id}/cancel").status_code == 200
    kept = submit(http, "brief", "report-2026-12-07")  # within the window: the same one
    assert kept.json()["id"] == first_id

    deadline = time.monotonic() + GONE_WITHIN_S
    while http.get(f"{NS}/invocations/{first_id}").status_code != 404:
        assert time.monotonic() < deadline, f"still there after {GONE_WITHIN_S} s"
        time.sleep(0.1)

    again = submit(http, "brief", "report-2026-12-07")
    assert again.status_code == 201, again.text
    assert again.json()["id"] != first_id
    metrics = http.get("/metrics").text
    assert 'lakeshore_retention_deleted_total{kind="invocations"} 1.0' in metrics


def test_apply_writes_a_queues_retention_s_and_plans_its_change(
    server: LakeshoreServer, http: httpx.Client, tmp_path: Path
) -> None:
    cli = Cli(server.url, server.admin_token, tmp_path / "cli")
    (tmp_path / "cli").mkdir()
    path = tmp_path / "lakeshore.yaml"
    path.write_text("queues:\n  - name: kept\n    retention_s: 86400\n")
    assert cli.run("apply", "-f", str(path)).returncode == 0
    assert http.get(f"{NS}/queues/kept").json()["retention_s"] == 86400

    path.write_text("queues:\n  - name: kept\n    retention_s: 3600\n")
    planned = cli.run("apply", "-f", str(path), "--dry-run")
    assert planned.returncode == 0, planned.stderr
    assert "retention_s" in planned.stdout
    assert cli.run("apply", "-f", str(path)).returncode == 0
    assert http.get(f"{NS}/queues/kept").json()["retention_s"] == 3600

    path.write_text("queues:\n  - name: kept\n    retention_s: 0\n")
    refused = cli.run("apply", "-f", str(path))
    assert refused.returncode != 0
    assert "retention_s" in refused.message
