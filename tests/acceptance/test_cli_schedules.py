"""``lakeshore schedules`` against a real ``lakeshore server``, on SQLite and PostgreSQL:
create, list, show, pause, resume, delete, bad input, and the server enqueueing a slot."""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.acceptance.conftest import Cli, LakeshoreServer

pytestmark = pytest.mark.acceptance


@pytest.fixture
def http(server: LakeshoreServer) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {server.admin_token}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as client:
        yield client


@pytest.fixture
def queue(http: httpx.Client) -> str:
    name = f"sched-{secrets.token_hex(4)}"
    assert http.post("/v1/namespaces/default/queues", json={"name": name}).status_code == 201
    return name


def test_create_list_show_pause_resume_delete(cli: Cli, queue: str, http: httpx.Client) -> None:
    made = cli.run(
        "schedules", "create", "tick", "--queue", queue, "--every", "1s",
        "--fn", "tests.udfs:add", "--arg", "1", "--arg", "2", "--kwargs", '{"x": "y"}',
        "--catch-up", "all", "-o", "json",
    ).json()  # fmt: skip
    assert (made["every_s"], made["args"], made["kwargs"]) == (1, [1, 2], {"x": "y"})
    assert made["catch_up"] == "all" and made["timezone"] == "UTC"
    nightly = cli.run(
        "schedules", "create", "nightly", "-q", queue, "--cron", "30 2 * * *",
        "--timezone", "Europe/Berlin", "--fn", "tests.udfs:add", "-o", "yaml",
    )  # fmt: skip
    assert nightly.returncode == 0, nightly
    assert "timezone: Europe/Berlin" in nightly.stdout

    # the server's leader submits tick's slots, keyed by schedule and slot
    deadline = time.monotonic() + 20
    made_by_schedule: list[dict[str, object]] = []
    while not made_by_schedule and time.monotonic() < deadline:
        found = http.get(f"/v1/namespaces/default/queues/{queue}/invocations").json()
        made_by_schedule = found["invocations"]
        time.sleep(0.2)
    [first, *_] = made_by_schedule
    assert str(first["key"]).startswith("schedule:tick:")
    assert first["args"] == [1, 2] and first["kwargs"] == {"x": "y"}

    table = cli.run("schedules", "list", "--queue", queue, "-o", "wide")
    assert table.returncode == 0, table
    assert (
        "nightly" in table.stdout and "every 1s" in table.stdout and "Europe/Berlin" in table.stdout
    )

    explained = cli.run("queues", "explain", queue)
    assert explained.returncode == 0, explained
    assert "schedule nightly: next slot 20" in explained.stdout

    paused = cli.run("schedules", "pause", "tick", "--queue", queue)
    assert paused.returncode == 0 and "paused" in paused.stdout, paused
    shown = cli.run("schedules", "show", "tick", "--queue", queue, "--json").json()
    assert shown["enabled"] is False and shown["next_slot"] is None
    resumed = cli.run("schedules", "resume", "tick", "--queue", queue, "-o", "json").json()
    assert resumed["enabled"] is True

    assert cli.run("schedules", "delete", "tick", "--queue", queue).returncode == 0
    names = [s["name"] for s in cli.run("schedules", "list", "-q", queue, "--json").json()]
    assert names == ["nightly"]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--cron", "99 * * * *"], "not a valid cron expression"),
        (["--every", "soon"], "is not a duration"),
        (["--every", "0s"], "every_s"),
        (["--cron", "* * * * *", "--every", "5s"], "give one of --cron and --every"),
        (["--every", "5s", "--timezone", "Moon/Base"], "not an IANA time zone"),
        (["--every", "5s", "--arg", "{nope"], "is not JSON"),
    ],
)
def test_bad_input_is_one_clear_line(cli: Cli, queue: str, args: list[str], words: str) -> None:
    result = cli.run("schedules", "create", "x", "--queue", queue, "--fn", "m:f", *args)
    assert result.returncode != 0, result
    assert "Traceback" not in result.stdout + result.stderr
    assert words in result.message, result


APPLIED = """
queues:
  - name: QUEUE
schedules:
  - queue: QUEUE
    name: nightly
    cron: "0 3 * * *"
    timezone: Europe/Paris
    fn: tests.udfs:add
    args: [1, 2]
"""


def test_apply_creates_then_reports_unchanged_and_dry_run_shows_a_change(
    cli: Cli, http: httpx.Client, tmp_path: Path
) -> None:
    queue = f"applied-{secrets.token_hex(4)}"
    path = tmp_path / "lakeshore.yaml"
    path.write_text(APPLIED.replace("QUEUE", queue))
    first = cli.run("apply", "-f", str(path))
    assert first.returncode == 0, first
    assert f"+ schedule {queue}/nightly (cron 0 3 * * *, tests.udfs:add)" in first.stdout
    shown = http.get(f"/v1/namespaces/default/queues/{queue}/schedules/nightly").json()
    assert (shown["timezone"], shown["args"]) == ("Europe/Paris", [1, 2])

    again = cli.run("apply", "-f", str(path))
    assert f"= schedule {queue}/nightly (unchanged)" in again.stdout, again
    assert "nothing to change" in again.message

    path.write_text(APPLIED.replace("QUEUE", queue).replace("0 3 * * *", "30 3 * * *"))
    planned = cli.run("apply", "-f", str(path), "--dry-run")
    assert f'~ schedule {queue}/nightly: cron "0 3 * * *" → "30 3 * * *"' in planned.stdout
    after = http.get(f"/v1/namespaces/default/queues/{queue}/schedules/nightly").json()
    assert after == shown  # a dry run sends nothing
    applied = cli.run("apply", "-f", str(path))
    assert applied.returncode == 0, applied
    changed = http.get(f"/v1/namespaces/default/queues/{queue}/schedules/nightly").json()
    assert changed["cron"] == "30 3 * * *"


def test_help_lists_every_schedule_command_and_explains_each_flag(offline_cli: Cli) -> None:
    group = offline_cli.run("schedules", "--help")
    assert group.returncode == 0, group
    for command in ("create", "list", "show", "pause", "resume", "delete"):
        assert re.search(rf"^\W*{command}\s", group.stdout, re.MULTILINE), command
    create = offline_cli.run("schedules", "create", "--help")
    for flag in ("--queue", "--cron", "--every", "--fn", "--arg", "--kwargs", "--timezone"):
        assert flag in create.stdout, flag
    assert "seconds first" in create.stdout and "none|one|all" in create.stdout
