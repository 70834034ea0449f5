"""``lakeshore server --config FILE`` / ``LAKESHORE_CONFIG``: a real server serving with its
file's settings, flags over it, and bad settings refused in one line, exit code 2."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.acceptance.conftest import (
    CLI_TIMEOUT_S,
    LAKESHORE,
    _stop,
    _wait_healthy,
    clean_env,
    free_port,
)

pytestmark = pytest.mark.acceptance


def write_config(tmp_path: Path, port: int, **extra: str) -> Path:
    lines = [
        f'database_url = "sqlite:///{tmp_path / "from-file.db"}"',
        f'data_dir = "{tmp_path / "data"}"',
        'host = "127.0.0.1"',
        f"port = {port}",
        "max_body_bytes = 2000",
        "elasticity_enabled = false",
        *(f"{key} = {value}" for key, value in extra.items()),
    ]
    path = tmp_path / "lakeshore-server.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


@contextmanager
def serving(
    tmp_path: Path, port: int, *args: str, **env: str
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``lakeshore server *args`` until the block ends; its URL once /healthz answers."""
    log_path = tmp_path / "server.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [str(LAKESHORE), "server", *args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=clean_env(**env),
            cwd=tmp_path,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(process, url, log_path, 0)
        yield url, process
    finally:
        _stop(process)


def refused(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LAKESHORE), *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=clean_env(**env),
        cwd=tmp_path,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )


def test_a_server_started_with_config_serves_with_the_files_settings(tmp_path: Path) -> None:
    port = free_port()
    config = write_config(tmp_path, port)

    with serving(tmp_path, port, "--config", str(config)) as (url, _):
        ready = httpx.get(f"{url}/readyz", timeout=5)
        token = (tmp_path / "data" / "admin-token").read_text().strip()
        too_big = httpx.post(
            f"{url}/v1/namespaces",
            content=b"x" * 3000,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            timeout=5,
        )

    assert ready.status_code == 200, ready.text
    assert ready.json()["status"] == "ready"
    assert (tmp_path / "from-file.db").is_file()  # the file's store, and its data dir
    assert too_big.status_code == 413  # the file's max_body_bytes, not the 1 MiB default


def test_lakeshore_config_names_the_file_and_a_flag_wins_over_it(tmp_path: Path) -> None:
    file_port, flag_port = free_port(), free_port()
    config = write_config(tmp_path, file_port)

    with serving(tmp_path, flag_port, "--port", str(flag_port), LAKESHORE_CONFIG=str(config)) as (
        url,
        _,
    ):
        ready = httpx.get(f"{url}/readyz", timeout=5)

    assert ready.status_code == 200, ready.text
    assert (tmp_path / "from-file.db").is_file()


@pytest.mark.parametrize("command", ["server", "up"])
def test_a_bad_value_in_the_environment_is_one_line_and_exit_code_2(
    command: str, tmp_path: Path
) -> None:
    done = refused(
        tmp_path, command, "--data-dir", str(tmp_path / "data"), ELASTICITY_INTERVAL_S="abc"
    )

    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        "lakeshore: ELASTICITY_INTERVAL_S: expected a number at least 0.1, got 'abc'"
    ]
    assert "Traceback" not in done.stdout + done.stderr
    assert not (tmp_path / "data").exists()  # refused before touching anything


def test_a_bad_value_in_the_file_is_one_line_naming_the_file_and_key(tmp_path: Path) -> None:
    config = write_config(tmp_path, free_port(), lease_s="-1")

    done = refused(tmp_path, "server", "--config", str(config))

    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        f"lakeshore: {config}: lease_s: expected a number at least 1 and at most 3600, got -1"
    ]
    assert "Traceback" not in done.stderr


def test_an_unknown_key_or_a_missing_file_is_refused_with_exit_code_2(tmp_path: Path) -> None:
    config = write_config(tmp_path, free_port(), elasticity_intervall_s="5")

    typo = refused(tmp_path, "up", "--config", str(config))
    missing = refused(tmp_path, "server", LAKESHORE_CONFIG=str(tmp_path / "nowhere.toml"))

    assert (typo.returncode, missing.returncode) == (2, 2)
    assert typo.stderr.splitlines() == [
        f"lakeshore: {config}: unknown key 'elasticity_intervall_s' "
        "(did you mean 'elasticity_interval_s'?)"
    ]
    assert missing.stderr.splitlines() == [
        f"lakeshore: LAKESHORE_CONFIG: no such file: {tmp_path / 'nowhere.toml'}"
    ]


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (
            bytes(range(256)) * 4,
            "not a TOML file: byte 128 is not UTF-8 (TOML files are UTF-8 text)",
        ),
        (
            "port = 8270\nlease_s = 3\n".encode("utf-16"),
            "not a TOML file: byte 0 is not UTF-8 (TOML files are UTF-8 text)",
        ),
        (
            b"x = " + b"[" * 500 + b"]" * 500,
            "not valid TOML: arrays or tables nested too deeply to read",
        ),
    ],
    ids=["binary", "utf-16", "500-deep"],
)
@pytest.mark.parametrize("command", ["server", "up"])
def test_a_config_file_that_is_not_utf8_toml_is_one_line_and_exit_code_2(
    tmp_path: Path, command: str, content: bytes, problem: str
) -> None:
    config = tmp_path / "lakeshore-server.toml"
    config.write_bytes(content)

    done = refused(tmp_path, command, "--config", str(config), "--data-dir", str(tmp_path / "d"))

    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.splitlines() == [f"lakeshore: {config}: {problem}"]
    assert "Traceback" not in done.stdout + done.stderr
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize(
    ("variable", "problem"),
    [
        ("LAKESHORE_REAPER_INTERVAL_S", "expected 0 (never) or a number at least 0.1, got '1e-9'"),
        ("ELASTICITY_INTERVAL_S", "expected a number at least 0.1, got '1e-9'"),
        ("LAKESHORE_LEASE_S", "expected a number at least 1 and at most 3600, got '1e-9'"),
    ],
)
def test_a_period_of_a_nanosecond_is_refused_at_start(
    tmp_path: Path, variable: str, problem: str
) -> None:
    done = refused(tmp_path, "server", "--data-dir", str(tmp_path / "d"), **{variable: "1e-9"})

    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.splitlines() == [f"lakeshore: {variable}: {problem}"]
