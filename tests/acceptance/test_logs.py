"""``LAKESHORE_LOG_FORMAT=json``: a real server and a real daemon write one JSON object
per line, the ids a line is about as fields of their own."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.acceptance.conftest import LAKESHORE, clean_env, running_server

pytestmark = pytest.mark.acceptance

NS = "/v1/namespaces/default"
ROOT = Path(__file__).resolve().parents[2]


def json_lines(path: Path) -> list[dict[str, Any]]:
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    assert lines, f"{path} is empty"
    parsed = []
    for line in lines:
        try:
            parsed.append(json.loads(line))
        except ValueError:
            pytest.fail(f"not a JSON line in {path.name}: {line!r}")
    return parsed


def test_server_and_daemon_log_json_with_ids(tmp_path: Path) -> None:
    env = clean_env(LAKESHORE_LOG_FORMAT="json", ELASTICITY_INTERVAL_S="0.2")
    log_path = tmp_path / "server.log"
    db, data = str(tmp_path / "l.db"), tmp_path / "data"
    with running_server("sqlite", db, data, log_path, env) as server:
        headers = {"Authorization": f"Bearer {server.admin_token}"}
        with httpx.Client(base_url=server.url, headers=headers, timeout=30) as http:
            fake = {"name": "fk", "kind": "fake", "config": {}}
            assert http.post(f"{NS}/providers", json=fake).status_code == 201
            elastic = {"kind": "fully_elastic", "min": 0, "max": 1}
            spec = {"name": "q", "providerRef": "fk", "elasticity": elastic}
            assert http.post(f"{NS}/queues", json=spec).status_code == 201
            made = http.post(f"{NS}/queues/q/invocations", json={"fn": "tests.udfs:noop"})
            assert made.status_code == 201
            events = f"{NS}/queues/q/events"
            for _ in range(100):  # the loop ticks every 0.2 s
                if any(e["action"] == "scale_up" for e in http.get(events).json()["events"]):
                    break
                time.sleep(0.1)
            daemon_log = tmp_path / "daemon.log"
            daemon_env = clean_env(
                LAKESHORE_URL=server.url,
                LAKESHORE_TOKEN=server.admin_token,
                LAKESHORE_LOG_FORMAT="json",
                PYTHONPATH=str(ROOT),
            )
            with daemon_log.open("wb") as out:
                args = [str(LAKESHORE), "daemon", "run", "--queue", "q", "--burst"]
                args += ["--id", "json-worker"]
                code = subprocess.run(
                    args, cwd=ROOT, env=daemon_env, stdout=out, stderr=subprocess.STDOUT,
                    timeout=120, check=False,
                ).returncode  # fmt: skip
            assert code == 0, daemon_log.read_text()
            assert http.get(f"{NS}/invocations/{made.json()['id']}").json()["state"] == "succeeded"

    lines = json_lines(log_path)
    assert {"time", "level", "logger", "message"} <= set(lines[0])
    [decision, *_] = [line for line in lines if line.get("action") == "scale_up"]
    assert (decision["namespace"], decision["queue"], decision["provider"]) == (
        "default",
        "q",
        "fk",
    )
    assert decision["launch"].startswith("lch_")
    access = [line for line in lines if line["logger"] == "uvicorn.access"]
    assert any("POST /v1/workers/hello" in line["message"] for line in access)

    daemon_lines = json_lines(daemon_log)
    serving = [line for line in daemon_lines if "serving" in line["message"]]
    assert serving and serving[0]["worker"] == "json-worker"
