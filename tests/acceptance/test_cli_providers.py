"""``lakeshore providers`` against a real ``lakeshore server``, on SQLite and PostgreSQL.

Each test uses provider names of its own, so the tests hold in any order against the
module's server.
"""

from __future__ import annotations

import secrets

import pytest

from tests.acceptance.conftest import Cli, Result

pytestmark = pytest.mark.acceptance


def unique(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


def assert_one_line_failure(result: Result) -> None:
    """Exited non-zero with one line on stderr, and no Python traceback anywhere."""
    assert result.returncode != 0, result
    assert len(result.stderr.strip().splitlines()) == 1, result
    assert "Traceback" not in result.stdout + result.stderr, result


def test_create_list_show_launches_delete(cli: Cli) -> None:
    name = unique("dry")
    added = cli.run(
        "providers", "create", name, "--kind", "fake",
        "--config", '{"launch_ttl_s": 30}', "--set", "fail_launch=quota exceeded", "--json",
    ).json()  # fmt: skip
    assert added["name"] == name
    assert added["kind"] == "fake"
    assert added["config"] == {
        "launch_ttl_s": 30.0,
        "fail_launch": "quota exceeded",
        "hang_s": 0.0,
    }

    listed = cli.run("providers", "list", "--json").json()
    assert name in {p["name"] for p in listed}
    table = cli.run("providers", "list")
    assert table.returncode == 0, table
    assert name in table.stdout
    assert "fake" in table.stdout

    assert cli.run("providers", "show", name, "--json").json() == added
    shown = cli.run("providers", "show", name)
    assert shown.returncode == 0, shown
    assert "launch_ttl_s" in shown.stdout

    assert cli.run("providers", "launches", name, "--limit", "5", "--json").json() == []

    removed = cli.run("providers", "delete", name)
    assert removed.returncode == 0, removed
    assert name in removed.stdout
    assert name not in {p["name"] for p in cli.run("providers", "list", "--json").json()}


def test_the_earlier_verbs_add_and_remove_still_work_hidden_from_help(cli: Cli) -> None:
    name = unique("old")
    assert cli.run("providers", "add", name, "--kind", "fake", "--json").json()["name"] == name
    removed = cli.run("providers", "remove", name)
    assert removed.returncode == 0 and f"provider {name} removed" in removed.stdout, removed
    listed = cli.run("providers", "--help").stdout
    assert " create " in listed and " delete " in listed
    assert " add " not in listed and " remove " not in listed
    gone = cli.run("providers", "show", name)
    assert_one_line_failure(gone)
    assert "not found" in gone.stderr


def test_plain_add_says_what_it_registered(cli: Cli) -> None:
    name = unique("hpc")
    result = cli.run("providers", "add", name, "--kind", "slurm", "--set", "partition=gpu")
    assert result.returncode == 0, result
    assert name in result.stdout
    assert "slurm" in result.stdout
    assert cli.run("providers", "show", name, "--json").json()["config"] == {"partition": "gpu"}


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ('{"launch_ttl_s": 30', "--config is not valid JSON"),
        ("launch_ttl_s=30", "--config is not valid JSON"),
        ("[1, 2]", "--config must be a JSON object"),
    ],
)
def test_bad_config_json_is_a_one_line_error(cli: Cli, config: str, says: str) -> None:
    name = unique("bad")
    result = cli.run("providers", "add", name, "--kind", "fake", "--config", config)
    assert_one_line_failure(result)
    assert says in result.stderr
    assert name not in {p["name"] for p in cli.run("providers", "list", "--json").json()}


def test_the_server_refusals_are_one_line_errors(cli: Cli) -> None:
    unknown_kind = cli.run("providers", "add", unique("p"), "--kind", "nope")
    assert_one_line_failure(unknown_kind)
    assert "unknown provider kind" in unknown_kind.stderr
    bad_value = cli.run("providers", "add", unique("p"), "--kind", "fake", "--set", "hang_s=-1")
    assert_one_line_failure(bad_value)
    assert "config.hang_s" in bad_value.stderr
    bad_set = cli.run("providers", "add", unique("p"), "--kind", "fake", "--set", "hang_s")
    assert_one_line_failure(bad_set)
    assert "KEY=VALUE" in bad_set.stderr


def test_a_provider_a_queue_uses_is_not_removed(cli: Cli) -> None:
    provider, queue = unique("dry"), unique("q")
    assert cli.run("providers", "add", provider, "--kind", "fake").returncode == 0
    assert cli.run("queues", "add", queue, "--provider", provider).returncode == 0
    refused = cli.run("providers", "remove", provider)
    assert_one_line_failure(refused)
    assert queue in refused.stderr
    assert "409" in refused.stderr


def test_help_lists_the_commands(cli: Cli) -> None:
    result = cli.run("providers", "--help")
    assert result.returncode == 0, result
    for command in ("create", "list", "show", "delete", "launches"):
        assert command in result.stdout
