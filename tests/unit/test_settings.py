"""Server settings: flags over the environment over the file over defaults, the spec's
``ELASTICITY_*`` names beside the ``LAKESHORE_`` ones, and refusals in one line naming the
setting as it was written."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from lakeshore import config_errors
from lakeshore.config import CONFIG_ENV, SPEC_NAMES, ConfigFile, ConfigFileError, Settings


@pytest.fixture(autouse=True)
def no_settings_in_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for key in list(os.environ):
        if key.upper().startswith(("LAKESHORE_", "ELASTICITY_")):
            monkeypatch.delenv(key)
    yield


def toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "lakeshore-server.toml"
    path.write_text(text)
    return path


def refused(
    config: Path | None = None, flags: dict[str, str] | None = None, **values: object
) -> list[str]:
    """The lines a server start would print for these settings."""
    with pytest.raises(ValidationError) as caught:
        Settings.load(config, **values)
    chosen = ConfigFile(config, "--config") if config else None
    return config_errors.refusals(caught.value, flags or {}, os.environ, chosen)


def test_an_admin_token_of_16_characters_is_accepted() -> None:
    assert Settings(admin_token="x" * 16).admin_token == "x" * 16


def test_an_admin_token_of_15_characters_is_refused_saying_the_minimum() -> None:
    with pytest.raises(ValidationError, match="it needs at least 16"):
        Settings(admin_token="x" * 15)


def test_an_empty_admin_token_means_unset_so_one_is_generated() -> None:
    assert Settings(admin_token="").admin_token is None


def test_the_file_alone_sets_what_it_names_and_leaves_the_rest_at_their_defaults(
    tmp_path: Path,
) -> None:
    path = toml(
        tmp_path,
        'lease_s = 12.5\ndatabase_url = "postgresql://db/lake"\nelasticity_enabled = false\n'
        'port = 9000\nlog_format = "json"\n',
    )

    settings = Settings.load(path)

    assert settings.lease_s == 12.5
    assert settings.database_url == "postgresql://db/lake"
    assert settings.elasticity_enabled is False
    assert settings.port == 9000
    assert settings.log_format == "json"
    assert settings.claim_recheck_s == 5.0  # not in the file: the default


def test_the_environment_wins_over_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = toml(tmp_path, "lease_s = 12\nreaper_interval_s = 3\n")
    monkeypatch.setenv("LAKESHORE_LEASE_S", "7")

    settings = Settings.load(path)

    assert settings.lease_s == 7
    assert settings.reaper_interval_s == 3


def test_a_flag_wins_over_the_environment_and_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = toml(tmp_path, 'database_url = "sqlite:///from-file.db"\nport = 9000\n')
    monkeypatch.setenv("LAKESHORE_DATABASE_URL", "sqlite:///from-env.db")

    settings = Settings.load(path, database_url="sqlite:///from-flag.db")

    assert settings.database_url == "sqlite:///from-flag.db"
    assert settings.port == 9000


def test_lakeshore_config_names_the_file_when_no_flag_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CONFIG_ENV, str(toml(tmp_path, "node_id = 'n1'\n")))
    other = tmp_path / "other.toml"
    other.write_text("node_id = 'n2'\n")

    assert Settings.load().node_id == "n1"
    assert Settings().node_id == "n1"  # the server's later reads see it too
    assert Settings.load(other).node_id == "n2"  # --config wins over LAKESHORE_CONFIG


@pytest.mark.parametrize(
    ("name", "field"),
    [
        ("ELASTICITY_ENABLED", "elasticity_enabled"),
        ("ELASTICITY_INTERVAL_S", "elasticity_interval_s"),
        ("ELASTICITY_CALL_TIMEOUT_S", "elasticity_call_timeout_s"),
        ("ELASTICITY_NOOP_RETENTION_S", "elasticity_noop_retention_s"),
    ],
)
def test_the_spec_name_and_the_lakeshore_name_both_set_an_elasticity_setting(
    monkeypatch: pytest.MonkeyPatch, name: str, field: str
) -> None:
    value = "0" if field == "elasticity_enabled" else "42"
    monkeypatch.setenv(name, value)
    assert getattr(Settings(), field) == float(value)

    monkeypatch.delenv(name)
    monkeypatch.setenv(f"LAKESHORE_{name}", value)
    assert getattr(Settings(), field) == float(value)


def test_the_lakeshore_name_wins_over_the_spec_name_which_wins_over_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = toml(tmp_path, "elasticity_interval_s = 9\n")
    monkeypatch.setenv("ELASTICITY_INTERVAL_S", "2")
    assert Settings.load(path).elasticity_interval_s == 2

    monkeypatch.setenv("LAKESHORE_ELASTICITY_INTERVAL_S", "3")
    assert Settings.load(path).elasticity_interval_s == 3


def test_a_variable_without_the_prefix_is_not_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEASE_S", "7")
    monkeypatch.setenv("DATABASE_URL", "postgresql://elsewhere/db")

    settings = Settings()

    assert settings.lease_s == 30
    assert settings.database_url is None


def test_an_unknown_key_in_the_file_is_refused_naming_it(tmp_path: Path) -> None:
    path = toml(tmp_path, "leas_s = 3\n")

    with pytest.raises(ConfigFileError) as caught:
        Settings.load(path)

    assert str(caught.value) == f"{path}: unknown key 'leas_s' (did you mean 'lease_s'?)"


def test_an_environment_name_is_not_a_file_key(tmp_path: Path) -> None:
    path = toml(tmp_path, "LAKESHORE_LEASE_S = 3\n")

    with pytest.raises(ConfigFileError, match="unknown key 'LAKESHORE_LEASE_S'"):
        Settings.load(path)


def test_a_missing_file_is_refused_naming_what_named_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gone = tmp_path / "gone.toml"
    with pytest.raises(ConfigFileError) as by_flag:
        Settings.load(gone)
    monkeypatch.setenv(CONFIG_ENV, str(gone))
    with pytest.raises(ConfigFileError) as by_env:
        Settings.load()

    assert str(by_flag.value) == f"--config: no such file: {gone}"
    assert str(by_env.value) == f"LAKESHORE_CONFIG: no such file: {gone}"


def test_a_file_that_is_not_toml_is_refused_saying_where(tmp_path: Path) -> None:
    path = toml(tmp_path, "lease_s = \n")

    with pytest.raises(ConfigFileError, match=r"not valid TOML: .*line 1"):
        Settings.load(path)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (bytes(range(256)), "not a TOML file: byte 128 is not UTF-8 (TOML files are UTF-8 text)"),
        ("lease_s = 3\n".encode("utf-16"), "not a TOML file: byte 0 is not UTF-8"),
        (b"x = " + b"[" * 500 + b"]" * 500, "not valid TOML: arrays or tables nested too deeply"),
        (b"x = " + b"{a = " * 500 + b"1" + b"}" * 500, "not valid TOML: arrays or tables"),
    ],
    ids=["binary", "utf-16", "deep-arrays", "deep-inline-tables"],
)
def test_a_file_that_is_not_utf8_or_nests_too_deeply_is_refused_in_one_line(
    tmp_path: Path, content: bytes, problem: str
) -> None:
    path = tmp_path / "lakeshore-server.toml"
    path.write_bytes(content)

    with pytest.raises(ConfigFileError) as caught:
        Settings.load(path)

    assert str(caught.value).startswith(f"{path}: {problem}")
    assert "\n" not in str(caught.value)


def test_a_bad_value_in_the_environment_is_one_line_naming_the_variable_as_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ELASTICITY_INTERVAL_S", "abc")

    assert refused() == ["ELASTICITY_INTERVAL_S: expected a number at least 0.1, got 'abc'"]


@pytest.mark.parametrize(
    ("name", "line"),
    [
        ("LAKESHORE_LEASE_S", "expected a number at least 1 and at most 3600, got '1e-9'"),
        ("ELASTICITY_INTERVAL_S", "expected a number at least 0.1, got '1e-9'"),
        ("LAKESHORE_CLAIM_RECHECK_S", "expected a number at least 0.1, got '1e-9'"),
        (
            "LAKESHORE_REAPER_INTERVAL_S",
            "expected 0 (never) or a number at least 0.1, got '1e-9'",
        ),
    ],
)
def test_a_period_below_its_floor_is_refused_saying_the_floor(
    monkeypatch: pytest.MonkeyPatch, name: str, line: str
) -> None:
    monkeypatch.setenv(name, "1e-9")

    assert refused() == [f"{name}: {line}"]


def test_the_floors_themselves_and_a_reaper_of_0_are_accepted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LAKESHORE_REAPER_INTERVAL_S", "0")
    settings = Settings(lease_s=1, elasticity_interval_s=0.1, claim_recheck_s=0.1)
    assert (settings.reaper_interval_s, settings.lease_s) == (0, 1)

    monkeypatch.setenv("LAKESHORE_REAPER_INTERVAL_S", "0.1")
    assert Settings().reaper_interval_s == 0.1


@pytest.mark.parametrize("value", ["inf", "nan", "-inf"])
def test_no_number_takes_inf_or_nan(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("LAKESHORE_ELASTICITY_NOOP_RETENTION_S", value)

    assert refused() == [
        f"LAKESHORE_ELASTICITY_NOOP_RETENTION_S: expected a number greater than 0, got {value!r}"
    ]


def test_forwarded_allow_ips_takes_addresses_networks_or_a_star_and_refuses_host_names() -> None:
    assert Settings().forwarded_allow_ips == "127.0.0.1,::1"
    given = Settings(forwarded_allow_ips=" 10.0.0.0/8, 192.0.2.7 ,fd00::/8,* ")
    assert given.forwarded_allow_ips == "10.0.0.0/8,192.0.2.7,fd00::/8,*"
    assert Settings(forwarded_allow_ips="").forwarded_allow_ips == ""  # trusts none

    assert refused(forwarded_allow_ips="10.0.0.1,lb.internal") == [
        "forwarded_allow_ips: expected addresses or networks (10.0.0.0/8), comma-separated, "
        "or *; 'lb.internal' is neither"
    ]


def test_a_bad_value_in_a_lower_case_variable_names_it_in_lower_case(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("lakeshore_metrics_public", "maybe")

    assert refused() == ["lakeshore_metrics_public: expected true or false, got 'maybe'"]


def test_a_bad_value_in_the_file_is_one_line_naming_the_file_and_its_key(tmp_path: Path) -> None:
    path = toml(tmp_path, 'lease_s = 7200\nlog_format = "xml"\n')

    assert refused(path) == [
        f"{path}: log_format: expected one of text, json, got 'xml'",
        f"{path}: lease_s: expected a number at least 1 and at most 3600, got 7200",
    ]


def test_a_bad_flag_value_names_the_flag(tmp_path: Path) -> None:
    lines = refused(None, {"log_level": "--log-level"}, log_level="loud")

    assert lines == [
        "--log-level: expected one of critical, error, warning, info, debug, trace, got 'loud'"
    ]


def test_a_refused_admin_token_or_database_url_is_never_echoed(tmp_path: Path) -> None:
    path = toml(tmp_path, 'admin_token = "short-secret"\ndatabase_url = 12\n')

    lines = refused(path)

    assert lines == [
        f"{path}: database_url: expected text",
        f"{path}: admin_token: the admin token is 12 characters; it needs at least 16 "
        "(or leave it unset to have one generated)",
    ]
    assert "short-secret" not in " ".join(lines)


DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def _documented() -> dict[str, list[str]]:
    """docs/configuration.md's server settings table: file key -> its cells."""
    text = DOC.read_text()
    table = text.split("## Server settings", 1)[1].split("\n\n", 2)[1]
    rows: dict[str, list[str]] = {}
    for line in table.splitlines()[2:]:
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        key = cells[0].strip("`")
        assert key not in rows, f"{key} documented twice"
        rows[key] = cells
    return rows


def _shown(default: object) -> str | None:
    if isinstance(default, bool):
        return "true" if default else "false"
    if isinstance(default, float) and default.is_integer():
        return str(int(default))
    if isinstance(default, int | float) or (isinstance(default, str) and default):
        return str(default)
    return None  # none, or computed: described in words


def test_docs_configuration_lists_every_setting_once_with_its_names_and_default() -> None:
    rows = _documented()

    assert sorted(rows) == sorted(Settings.model_fields)
    for field, info in Settings.model_fields.items():
        _, env, _, default, _ = rows[field]
        names = [f"LAKESHORE_{field.upper()}"]
        names += [name for name, target in SPEC_NAMES.items() if target == field]
        assert env == ", ".join(f"`{name}`" for name in names), field
        shown = _shown(info.default)
        if shown is not None:
            assert default == f"`{shown}`", field


def test_the_example_file_in_the_docs_is_accepted(tmp_path: Path) -> None:
    example = DOC.read_text().split("```toml\n", 1)[1].split("```", 1)[0]

    settings = Settings.load(toml(tmp_path, example))

    assert settings.node_id == "eu-1"
    assert settings.log_format == "json"
