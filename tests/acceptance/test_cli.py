"""The ``lakeshore`` CLI against a real ``lakeshore server``, on SQLite and PostgreSQL.

Every test that needs the server runs once per backend against that module's server, and
uses queue names of its own, so the tests hold in any order.
"""

from __future__ import annotations

import re
import secrets
import stat
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
import yaml

from tests.acceptance.conftest import Cli, LakeshoreServer, Result

pytestmark = pytest.mark.acceptance

TOKEN_RE = re.compile(r"lks_[0-9a-f]+_[A-Za-z0-9_-]+")


def unique(prefix: str) -> str:
    """A queue name no other test uses."""
    return f"{prefix}-{secrets.token_hex(3)}"


def assert_clean_failure(result: Result, *, code: int = 1) -> None:
    """Exited ``code`` with a message on stderr, and no Python traceback anywhere."""
    assert result.returncode == code, result
    assert result.stderr.strip(), result
    assert "Traceback" not in result.stdout + result.stderr, result


def add_queue(cli: Cli, name: str, *flags: str) -> dict[str, object]:
    result = cli.run("queues", "add", name, *flags, "--json")
    created: dict[str, object] = result.json()
    assert created["name"] == name
    return created


def show(cli: Cli, name: str) -> dict[str, object]:
    queue: dict[str, object] = cli.run("queues", "show", name, "--json").json()
    return queue


def names(queues: list[dict[str, object]]) -> set[object]:
    return {queue["name"] for queue in queues}


@pytest.fixture
def http(server: LakeshoreServer) -> Iterator[httpx.Client]:
    """The API of the module's server, as the admin: quick setup and read-back."""
    headers = {"Authorization": f"Bearer {server.admin_token}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=10.0) as client:
        yield client


def api_add(http: httpx.Client, name: str, **fields: object) -> None:
    response = http.post("/v1/namespaces/default/queues", json={"name": name, **fields})
    assert response.status_code == 201, response.text


def api_queue(http: httpx.Client, name: str, ns: str = "default") -> dict[str, object]:
    response = http.get(f"/v1/namespaces/{ns}/queues/{name}")
    assert response.status_code == 200, response.text
    queue: dict[str, object] = response.json()
    return queue


# --- the server process ------------------------------------------------------------------


def test_server_writes_admin_token_0600_and_prints_its_path(server: LakeshoreServer) -> None:
    path = server.admin_token_path
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert TOKEN_RE.fullmatch(server.admin_token)
    log = server.log()
    assert f"admin token: {path}" in log.splitlines()
    assert server.admin_token not in log  # the path is printed, never the secret


# --- queues: create, read, change ------------------------------------------------------------


@pytest.mark.parametrize(
    ("spelling", "stored", "flags", "knobs"),
    [
        pytest.param(
            "fully-elastic",
            "fully_elastic",
            ["--kind", "priority", "--provider", "aws-east", "--min", "0", "--max", "4"],
            {"min": 0, "max": 4},
            id="fully-elastic",
        ),
        pytest.param(
            "pool-with-threshold",
            "pool_with_threshold",
            ["--threshold", "0.7", "--threshold-low", "0.2", "--max", "8"],
            {"threshold": 0.7, "threshold_low": 0.2, "max": 8},
            id="pool-with-threshold",
        ),
        pytest.param("max-count", "max_count", ["--max", "3"], {"max": 3}, id="max-count"),
    ],
)
def test_queues_add_stores_hyphenated_elasticity_kind_underscored(
    cli: Cli, spelling: str, stored: str, flags: list[str], knobs: dict[str, object]
) -> None:
    name = unique("hyphen")
    add_queue(cli, name, "--elasticity", spelling, *flags)

    queue = show(cli, name)
    assert queue["elasticity"] == {"kind": stored, **knobs}
    if spelling == "fully-elastic":
        assert queue["kind"] == "priority"
        assert queue["providerRef"] == "aws-east"


def test_api_refuses_hyphenated_elasticity_kind_with_422_naming_underscored_form(
    http: httpx.Client,
) -> None:
    name = unique("http-hyphen")
    body = {"name": name, "elasticity": {"kind": "fully-elastic", "min": 0, "max": 4}}

    response = http.post("/v1/namespaces/default/queues", json=body)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["field"] == "elasticity.kind"
    assert "fully_elastic" in error["message"]
    assert http.get(f"/v1/namespaces/default/queues/{name}").status_code == 404


def test_queues_list_json_includes_new_queue_with_its_fields(cli: Cli) -> None:
    name = unique("listed")
    add_queue(cli, name, "--kind", "filo", "--description", "for the list test")

    listed = {q["name"]: q for q in cli.run("queues", "list", "--json").json()}
    assert name in listed
    assert listed[name]["kind"] == "filo"
    assert listed[name]["state"] == "active"
    assert listed[name]["description"] == "for the list test"


def test_queues_show_json_returns_the_stored_record(cli: Cli) -> None:
    name = unique("shown")
    created = add_queue(cli, name, "--kind", "boltzmann")

    queue = show(cli, name)
    assert queue == created
    assert queue["kind"] == "boltzmann"
    assert str(queue["id"]).startswith("q_")


def test_queues_stats_json_reports_zeros_for_a_new_queue(cli: Cli, http: httpx.Client) -> None:
    name = unique("stats")
    api_add(http, name, elasticity={"kind": "fully_elastic", "max": 2})

    stats = cli.run("queues", "stats", name, "--json").json()
    assert stats["queue"] == name
    assert stats["state"] == "active"
    assert stats["pending"] == 0
    assert stats["running"] == 0
    assert stats["daemonCount"] == 0
    assert stats["capacity"] == 0
    assert stats["utilization"] == 0
    assert set(stats["byState"].values()) == {0}


def test_queues_patch_changes_max_and_threshold_and_keeps_the_kind(
    cli: Cli, http: httpx.Client
) -> None:
    name = unique("patched")
    add_queue(
        cli, name, "--kind", "priority", "--provider", "aws-east",
        "--elasticity", "fully-elastic", "--min", "0", "--max", "4",
    )  # fmt: skip

    patched = cli.run("queues", "patch", name, "--max", "32", "--threshold", "0.6", "--json")
    assert patched.json()["elasticity"]["max"] == 32

    queue = api_queue(http, name)
    assert queue["kind"] == "priority"
    assert queue["providerRef"] == "aws-east"
    assert queue["elasticity"] == {"kind": "fully_elastic", "min": 0, "max": 32, "threshold": 0.6}


# --- queues: lifecycle -----------------------------------------------------------------------


def test_lifecycle_commands_move_a_queue_through_each_state(cli: Cli, http: httpx.Client) -> None:
    name = unique("cycle")
    api_add(http, name)

    for command, state in [
        ("drain", "draining"),
        ("pause", "paused"),
        ("resume", "active"),
        ("drain", "draining"),
        ("archive", "archived"),
        ("unarchive", "active"),
    ]:
        moved = cli.run("queues", command, name, "--json")
        assert moved.json()["state"] == state, command
        assert api_queue(http, name)["state"] == state, command


def test_lifecycle_command_without_json_says_the_new_state(cli: Cli, http: httpx.Client) -> None:
    name = unique("said")
    api_add(http, name)

    result = cli.run("queues", "pause", name)
    assert result.returncode == 0, result
    assert f"queue {name} is now paused" in result.stdout


def test_repeating_a_transition_succeeds_and_changes_nothing(cli: Cli, http: httpx.Client) -> None:
    name = unique("again")
    api_add(http, name)
    first = cli.run("queues", "drain", name, "--json").json()

    second = cli.run("queues", "drain", name, "--json").json()
    assert second["state"] == "draining"
    assert second["updatedAt"] == first["updatedAt"]


def test_queues_list_hides_archived_queues_unless_all(cli: Cli, http: httpx.Client) -> None:
    archived, kept = unique("archived"), unique("kept")
    api_add(http, archived)
    api_add(http, kept)
    cli.run("queues", "archive", archived, "--json").json()

    default = cli.run("queues", "list", "--json").json()
    assert kept in names(default)
    assert archived not in names(default)

    everything = {q["name"]: q for q in cli.run("queues", "list", "--all", "--json").json()}
    assert everything[archived]["state"] == "archived"
    assert kept in everything


def test_refused_transition_exits_nonzero_with_server_message_and_no_traceback(
    cli: Cli, http: httpx.Client
) -> None:
    name = unique("refused")
    api_add(http, name)
    assert http.post(f"/v1/namespaces/default/queues/{name}/archive").status_code == 200

    result = cli.run("queues", "pause", name)
    assert_clean_failure(result)
    assert "queue is archived; run unarchive before pause" in result.message
    assert "409" in result.message
    assert api_queue(http, name)["state"] == "archived"


def test_patch_on_an_archived_queue_is_refused_without_traceback(
    cli: Cli, http: httpx.Client
) -> None:
    name = unique("readonly")
    api_add(http, name, elasticity={"kind": "max_count", "max": 2})
    assert http.post(f"/v1/namespaces/default/queues/{name}/archive").status_code == 200

    result = cli.run("queues", "patch", name, "--max", "5")
    assert_clean_failure(result)
    assert "archived" in result.message
    assert api_queue(http, name)["elasticity"] == {"kind": "max_count", "max": 2}


# --- namespaces and tokens -------------------------------------------------------------------


@dataclass
class Team:
    name: str
    token: str
    create: Result
    issue: Result


@pytest.fixture(scope="module")
def team_a(server: LakeshoreServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Team]:
    """``team-a``, created through the CLI on the module's server, and a token for it."""
    admin = Cli(server.url, server.admin_token, tmp_path_factory.mktemp("team-cli"))
    created = admin.run("namespaces", "create", "team-a")
    assert created.returncode == 0, created
    issued = admin.run("tokens", "create", "--namespace", "team-a")
    assert issued.returncode == 0, issued
    yield Team("team-a", issued.stdout.strip(), created, issued)


def as_team(team: Team) -> dict[str, str | None]:
    return {"LAKESHORE_TOKEN": team.token, "LAKESHORE_NAMESPACE": team.name}


def test_namespaces_create_says_the_namespace_was_created(team_a: Team) -> None:
    assert "namespace team-a created" in team_a.create.stdout


def test_namespaces_list_json_shows_default_and_created_namespaces(cli: Cli, team_a: Team) -> None:
    found = cli.run("namespaces", "list", "--json").json()
    assert {"default", "team-a"} <= names(found)
    assert all(str(ns["id"]).startswith("ns_") for ns in found)


def test_tokens_create_prints_only_the_token_on_stdout(team_a: Team) -> None:
    assert TOKEN_RE.fullmatch(team_a.token), team_a.issue
    assert team_a.issue.stdout == team_a.token + "\n"
    assert "team-a" in team_a.issue.message
    assert "shown once" in team_a.issue.message


def test_tokens_list_and_revoke_through_the_cli(cli: Cli) -> None:
    ns = unique("tok")
    assert cli.run("namespaces", "create", ns).returncode == 0
    token = cli.run("tokens", "create", "-n", ns, "--name", "leaky").stdout.strip()
    as_it = {"LAKESHORE_NAMESPACE": ns}
    assert cli.run("queues", "list", token=token, env_extra=as_it).returncode == 0
    [listed] = cli.run("tokens", "list", "-n", ns, "--json").json()
    assert (listed["name"], listed["revokedAt"]) == ("leaky", None)
    assert token not in cli.run("tokens", "list", "-n", ns).stdout
    revoked = cli.run("tokens", "delete", listed["id"], "-n", ns)
    assert revoked.returncode == 0, revoked
    assert f"token {listed['id']} revoked" in revoked.stdout
    refused = cli.run("queues", "list", token=token, env_extra=as_it)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    table = cli.run("tokens", "list", "-n", ns).stdout
    assert listed["id"] in table and "live" not in table
    unknown = cli.run("tokens", "revoke", "tok_nope", "-n", ns)
    assert unknown.returncode != 0 and "no token" in unknown.message, unknown


def test_namespace_token_adds_and_lists_queues_in_its_namespace(
    cli: Cli, http: httpx.Client, team_a: Team
) -> None:
    name = unique("team-queue")

    added = cli.run("queues", "add", name, "--json", env_extra=as_team(team_a))
    assert added.json()["name"] == name
    listed = cli.run("queues", "list", "--json", env_extra=as_team(team_a)).json()
    assert name in names(listed)

    # it lives in team-a, not in the default namespace
    assert api_queue(http, name, ns="team-a")["name"] == name
    assert http.get(f"/v1/namespaces/default/queues/{name}").status_code == 404


def test_namespace_token_asking_for_default_namespace_gets_not_found(
    cli: Cli, team_a: Team
) -> None:
    team_env = {"LAKESHORE_TOKEN": team_a.token, "LAKESHORE_NAMESPACE": "default"}

    result = cli.run("queues", "list", env_extra=team_env)
    assert_clean_failure(result)
    assert 'namespace "default" not found' in result.message
    assert "404" in result.message


def test_namespace_token_lists_only_its_own_namespace(cli: Cli, team_a: Team) -> None:
    found = cli.run("namespaces", "list", "--json", env_extra=as_team(team_a)).json()
    assert names(found) == {"team-a"}


def test_namespace_token_cannot_create_namespaces(cli: Cli, team_a: Team) -> None:
    result = cli.run("namespaces", "create", unique("team-x"), env_extra=as_team(team_a))
    assert_clean_failure(result)
    assert "only the admin token can create namespaces" in result.message


def test_server_token_and_namespace_flags_override_the_environment(
    cli: Cli, http: httpx.Client, server: LakeshoreServer, team_a: Team
) -> None:
    name = unique("flags")
    wrong_env = {"LAKESHORE_URL": "http://127.0.0.1:1", "LAKESHORE_TOKEN": "not-a-token"}
    flags = ["--server", server.url, "--token", team_a.token, "--namespace", "team-a"]

    added = cli.run(*flags, "queues", "add", name, "--json", env_extra=wrong_env)
    assert added.json()["namespaceId"] == api_queue(http, name, ns="team-a")["namespaceId"]
    listed = cli.run(*flags, "queues", "list", "--json", env_extra=wrong_env).json()
    assert name in names(listed)


def test_global_options_follow_the_command_and_the_one_closest_to_it_wins(
    cli: Cli, http: httpx.Client, server: LakeshoreServer, team_a: Team
) -> None:
    name = unique("after")
    wrong_env = {"LAKESHORE_URL": "http://127.0.0.1:1", "LAKESHORE_TOKEN": "not-a-token"}
    flags = ["--server", server.url, "--token", team_a.token, "--namespace", "team-a"]

    added = cli.run("queues", "add", name, *flags, "--json", env_extra=wrong_env)
    assert added.json()["namespaceId"] == api_queue(http, name, ns="team-a")["namespaceId"]
    both = cli.run("-n", "default", "queues", "list", "-n", "team-a", "--json", token=team_a.token)
    assert name in names(both.json())
    flag_over_env = cli.run("queues", "list", "-n", "default", env_extra=as_team(team_a))
    assert_clean_failure(flag_over_env)
    assert 'namespace "default" not found' in flag_over_env.message


def test_output_json_yaml_and_wide_before_or_after_the_command(cli: Cli) -> None:
    name = unique("formats")
    add_queue(cli, name, "--description", "only-in-wide")

    as_json = cli.run("queues", "show", name, "--json").json()
    assert cli.run("queues", "show", name, "-o", "json").json() == as_json
    assert cli.run("-o", "json", "queues", "show", name).json() == as_json
    as_yaml = cli.run("queues", "show", name, "--output", "yaml")
    assert as_yaml.returncode == 0, as_yaml
    assert yaml.safe_load(as_yaml.stdout) == as_json
    before = cli.run("-o", "yaml", "queues", "list")
    assert as_json in yaml.safe_load(before.stdout)
    narrow, wide = cli.run("queues", "list"), cli.run("queues", "list", "-o", "wide")
    assert name in narrow.stdout and name in wide.stdout
    assert "only-in-wide" not in narrow.stdout and "description" not in narrow.stdout
    assert "only-in-wide" in wide.stdout and "description" in wide.stdout
    contradiction = cli.run("queues", "list", "--json", "-o", "yaml")
    assert_clean_failure(contradiction, code=2)
    assert "--json is -o json" in contradiction.message


# --- tokens and connections that fail --------------------------------------------------------


def test_wrong_token_exits_nonzero_with_a_message_about_the_token(cli: Cli) -> None:
    result = cli.run("queues", "list", token="lks_0000000000000000_not-the-real-secret")
    assert_clean_failure(result)
    assert "invalid or missing token" in result.message
    assert "--token / LAKESHORE_TOKEN" in result.message
    assert "401" in result.message


def test_missing_token_exits_nonzero_asking_for_one(cli: Cli) -> None:
    result = cli.run("queues", "list", token=None)
    assert_clean_failure(result)
    assert "missing token" in result.message
    assert "--token / LAKESHORE_TOKEN" in result.message


def test_cli_uses_the_local_admin_token_from_the_data_dir(
    cli: Cli, server: LakeshoreServer
) -> None:
    name = unique("local")
    env = {"LAKESHORE_DATA_DIR": str(server.data_dir)}

    added = cli.run("queues", "add", name, "--json", token=None, env_extra=env)
    assert added.json()["name"] == name


def test_unreachable_server_exits_nonzero_with_a_clear_message(offline_cli: Cli) -> None:
    result = offline_cli.run(
        "--server", "http://127.0.0.1:1", "--token", "anything", "queues", "list"
    )
    assert_clean_failure(result)
    assert "cannot reach the Lakeshore server at http://127.0.0.1:1" in result.message
    assert "is `lakeshore server` running?" in result.message


def test_a_module_that_cannot_be_preloaded_stops_the_daemon_at_start(
    offline_cli: Cli,
) -> None:
    result = offline_cli.run(
        "--token", "t", "daemon", "run", "--preload", "tests.no_such_module", "--burst"
    )
    assert_clean_failure(result)
    assert "cannot preload tests.no_such_module: ModuleNotFoundError" in result.message
    result = offline_cli.run("--token", "t", "daemon", "run", "--preload", "not a module")
    assert_clean_failure(result)
    assert "'not a module' is not a module name" in result.message


# --- invalid input ---------------------------------------------------------------------------


def test_unknown_elasticity_is_a_usage_error_and_creates_nothing(
    cli: Cli, http: httpx.Client
) -> None:
    name = unique("nonsense")

    result = cli.run("queues", "add", name, "--elasticity", "nonsense")
    assert_clean_failure(result, code=2)
    assert "unknown elasticity 'nonsense'" in result.message
    assert "fully-elastic" in result.message
    assert http.get(f"/v1/namespaces/default/queues/{name}").status_code == 404


def test_scaling_knob_without_elasticity_is_a_usage_error(cli: Cli) -> None:
    result = cli.run("queues", "add", unique("knob"), "--min", "1")
    assert_clean_failure(result, code=2)
    assert "--min needs --elasticity" in result.message


def test_invalid_queue_name_exits_nonzero_with_the_server_validation_message(cli: Cli) -> None:
    result = cli.run("queues", "add", "BadName")
    assert_clean_failure(result)
    assert "name: 'BadName' is not a valid name" in result.message
    assert "422" in result.message


def test_show_of_a_missing_queue_exits_nonzero_with_not_found(cli: Cli) -> None:
    name = unique("missing")
    result = cli.run("queues", "show", name)
    assert_clean_failure(result)
    assert f'queue "{name}" not found' in result.message


# --- help ------------------------------------------------------------------------------------


def test_top_level_help_lists_the_command_groups(offline_cli: Cli) -> None:
    result = offline_cli.run("--help")
    assert result.returncode == 0, result
    for command in ("server", "queues", "namespaces", "tokens"):
        assert re.search(rf"^\W*{command}\s", result.stdout, re.MULTILINE), command


def test_queues_help_lists_every_queue_command(offline_cli: Cli) -> None:
    result = offline_cli.run("queues", "--help")
    assert result.returncode == 0, result
    commands = ["create", "patch", "list", "show", "stats"]
    commands += ["drain", "pause", "resume", "archive", "unarchive"]
    for command in commands:
        assert re.search(rf"^\W*{command}\s", result.stdout, re.MULTILINE), command
    assert not re.search(r"^\W*add\s", result.stdout, re.MULTILINE)  # an alias, hidden


# --- names, tokens and paths that once slipped through ---------------------------------------


def test_queue_name_with_path_characters_cannot_reach_another_queue(
    cli: Cli, http: httpx.Client
) -> None:
    victim = unique("victim")
    api_add(http, victim)

    result = cli.run("queues", "pause", f"elsewhere/../{victim}")
    assert api_queue(http, victim)["state"] == "active"
    assert_clean_failure(result)


def test_non_ascii_token_is_refused_without_a_traceback(cli: Cli) -> None:
    result = cli.run("queues", "list", token="lks_tökén")
    assert_clean_failure(result)
    assert "token" in result.message


def test_a_token_with_stray_whitespace_still_works_and_is_never_echoed(
    cli: Cli, server: LakeshoreServer
) -> None:
    result = cli.run("queues", "list", "--json", token=server.admin_token + " \n")
    assert result.returncode == 0, result
    assert server.admin_token not in result.stdout + result.stderr


def test_explain_of_a_pooled_queue_names_its_pool_and_the_policy_it_follows(
    cli: Cli, http: httpx.Client
) -> None:
    pool = unique("pool")
    first, second = f"{pool}-a", f"{pool}-b"
    api_add(http, first, elasticity={"kind": "fully_elastic", "min": 0, "max": 2, "pool": pool})
    api_add(http, second, elasticity={"kind": "fully_elastic", "min": 0, "max": 5, "pool": pool})
    result = cli.run("queues", "explain", second)
    assert result.returncode == 0, result
    text = " ".join(result.stdout.split())
    assert f"ticked as pool:{pool}" in text
    assert f"in pool {pool} (members: {first}, {second}); the pool's feed is pool:{pool}" in text
    assert f"the pool follows the policy of {first}" in text
    assert "policy: fully_elastic, min 0, max 2" in text
    assert f'note: queue "{second}" declares kind=fully_elastic min=0 max=5' in text
    data = cli.run("queues", "explain", second, "--json").json()
    assert data["pool"]["members"] == [first, second] and data["policy"]["max"] == 2
