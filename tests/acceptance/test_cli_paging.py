"""Paged lists through the real CLI and server: `lakeshore invocations list` a page at a
time; `lakeshore queues list` and `lakeshore apply` reading every page of the queues."""

from __future__ import annotations

import secrets
from pathlib import Path

import httpx
import pytest

from tests.acceptance.conftest import Cli, LakeshoreServer

pytestmark = pytest.mark.acceptance


def test_invocations_list_pages_with_the_cursor_it_prints(
    server: LakeshoreServer, cli: Cli
) -> None:
    queue = f"paged-{server.backend}"
    made = [cli.run("submit", queue, "tests.udfs:noop").stdout.strip() for _ in range(5)]
    first = cli.run("invocations", "list", queue, "--limit", "2", "--json")
    assert first.returncode == 0, first.stderr
    assert [i["id"] for i in first.json()] == made[::-1][:2]  # newest first
    cursor = first.stderr.strip().removeprefix("next page: --cursor ")
    assert cursor and " " not in cursor
    second = cli.run("invocations", "list", queue, "--limit", "2", "--cursor", cursor, "--json")
    assert [i["id"] for i in second.json()] == made[::-1][2:4]
    table = cli.run("invocations", "list", queue, "--limit", "4")
    assert table.returncode == 0
    assert f"more: lakeshore invocations list {queue} --cursor " in table.stderr
    everything = cli.run("invocations", "list", queue, "--json")
    assert len(everything.json()) == 5 and "next page" not in everything.stderr
    bad = cli.run("invocations", "list", queue, "--cursor", "not-a-cursor")
    assert bad.returncode == 1 and "Traceback" not in bad.stderr


@pytest.fixture
def many_queues(server: LakeshoreServer) -> tuple[str, list[str]]:
    """A namespace of its own holding more queues than one page of the list (100)."""
    namespace = f"pages-{secrets.token_hex(4)}"
    names = [f"q-{i:03d}" for i in range(101)]
    headers = {"Authorization": f"Bearer {server.admin_token}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as http:
        assert http.post("/v1/namespaces", json={"name": namespace}).status_code == 201
        for name in names:
            created = http.post(f"/v1/namespaces/{namespace}/queues", json={"name": name})
            assert created.status_code == 201, created.text
    return namespace, names


def test_queues_list_shows_every_page(many_queues: tuple[str, list[str]], cli: Cli) -> None:
    namespace, names = many_queues

    listed = cli.run("--namespace", namespace, "queues", "list", "--json").json()

    assert [q["name"] for q in listed] == names


def test_apply_sees_a_queue_past_the_first_page_and_leaves_it_unchanged(
    many_queues: tuple[str, list[str]], cli: Cli, tmp_path: Path
) -> None:
    namespace, names = many_queues
    declared = tmp_path / "lakeshore.yaml"
    declared.write_text(f"queues:\n  - name: {names[-1]}\n")  # on the second page

    applied = cli.run("--namespace", namespace, "apply", "-f", str(declared))

    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "nothing to change (1 unchanged)" in applied.message + " ".join(applied.stdout.split())
