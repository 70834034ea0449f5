"""``lakeshore daemon launch|list|kill`` against a real server (both stores): the manual
fleet goes through the provider and the launch tracker, and a kill retires a daemon."""

from __future__ import annotations

import secrets

import httpx
import pytest

from tests.acceptance.conftest import Cli, LakeshoreServer

pytestmark = pytest.mark.acceptance


def unique(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


def test_create_list_delete_daemons_and_the_earlier_verbs_still_work(
    cli: Cli, server: LakeshoreServer
) -> None:
    provider, queue = unique("fk"), unique("fixed")
    assert cli.run("providers", "create", provider, "--kind", "fake").returncode == 0
    added = cli.run("queues", "create", queue, "--provider", provider)
    assert added.returncode == 0, added
    launched = cli.run("daemon", "create", "--queue", queue, "--count", "2", "--json").json()
    assert [launch["state"] for launch in launched["launches"]] == ["in_flight", "in_flight"]
    recorded = cli.run("providers", "launches", provider, "--json").json()
    assert {launch["id"] for launch in recorded} == {
        launch["launchId"] for launch in launched["launches"]
    }
    headers = {"Authorization": f"Bearer {server.admin_token}"}
    hello = httpx.post(
        f"{server.url}/v1/workers/hello",
        json={"queues": [queue], "launch_id": launched["launches"][0]["launchId"]},
        headers=headers,
    )
    worker = hello.json()["id"]
    listed = cli.run("daemon", "list", "--queue", queue, "--json").json()["daemons"]
    assert [(d["id"], d["provider"]) for d in listed] == [(worker, provider)]
    table = cli.run("daemon", "list", "--queue", queue)
    assert worker in table.stdout
    killed = cli.run("daemon", "delete", worker)
    assert killed.returncode == 0, killed
    assert f"daemon {worker} retired" in killed.stdout
    assert cli.run("daemon", "list", "--queue", queue, "--json").json()["daemons"] == []
    again = cli.run("daemon", "kill", worker)
    assert again.returncode != 0 and "not found" in again.stderr
    assert "Traceback" not in again.stdout + again.stderr


def test_launch_failures_are_one_line(cli: Cli) -> None:
    provider, queue = unique("broken"), unique("q")
    cli.run("providers", "add", provider, "--kind", "fake", "--set", "fail_launch=no capacity")
    cli.run("queues", "add", queue, "--provider", provider)
    failed = cli.run("daemon", "launch", "--queue", queue)
    assert failed.returncode != 0
    assert "no capacity" in failed.stderr
    assert len(failed.stderr.strip().splitlines()) == 1
    bare = unique("bare")
    cli.run("queues", "add", bare)
    refused = cli.run("daemon", "launch", "--queue", bare)
    assert refused.returncode != 0 and "providerRef" in refused.stderr
