"""``lakeshore queues create --elasticity wait-target --wait 60s`` against a real server,
on SQLite and PostgreSQL: the flags are stored as the policy's fields, and a patch changes
only the knobs given."""

from __future__ import annotations

import secrets

import pytest

from tests.acceptance.conftest import Cli

pytestmark = pytest.mark.acceptance


def test_queues_create_takes_a_wait_target_and_max_step(cli: Cli) -> None:
    name = f"wait-{secrets.token_hex(3)}"
    created = cli.run(
        "queues",
        "create",
        name,
        "--elasticity",
        "wait-target",
        "--wait",
        "60s",
        "--max",
        "32",
        "--json",
    ).json()
    assert created["elasticity"] == {"kind": "wait_target", "wait_s": 60.0, "max": 32}
    patched = cli.run("queues", "patch", name, "--wait", "5m", "--max-step", "4", "--json").json()
    assert patched["elasticity"] == {
        "kind": "wait_target",
        "wait_s": 300.0,
        "max": 32,
        "max_step": 4,
    }
    explained = cli.run("queues", "explain", name)
    assert "policy: wait_target, min 0, max 32, wait 300 s, max step 4" in explained.stdout


def test_a_wait_target_without_its_wait_is_refused_cleanly(cli: Cli) -> None:
    result = cli.run(
        "queues", "create", f"nowait-{secrets.token_hex(3)}", "--elasticity", "wait-target"
    )
    assert result.returncode != 0
    assert "wait_s" in result.stderr
    assert "Traceback" not in result.stdout + result.stderr
