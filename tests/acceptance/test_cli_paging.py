"""`lakeshore invocations list` a page at a time, through the real CLI and server."""

from __future__ import annotations

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
