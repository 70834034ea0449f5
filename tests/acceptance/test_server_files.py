"""What a ``lakeshore server`` process leaves on disk, and the settings it refuses to start with.

The data dir (and any folder the server creates for it) is 0700 and the SQLite file with
its ``-wal``/``-shm`` files 0600 even under ``umask 000``; an admin token shorter than 16
characters — from ``LAKESHORE_ADMIN_TOKEN`` or from the token file — stops the start with
one line and exit status 1.
"""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.acceptance.conftest import (
    CLI_TIMEOUT_S,
    LAKESHORE,
    clean_env,
    free_port,
    running_server,
)
from tests.conftest import BACKENDS

pytestmark = pytest.mark.acceptance


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("backend", BACKENDS)
def test_server_under_umask_000_keeps_its_data_dir_0700_and_its_files_0600(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    parent = tmp_path / "made-by-lakeshore"
    data_dir = parent / "data"
    sqlite_file = data_dir / "lakeshore.db"
    db = str(sqlite_file) if backend == "sqlite" else request.getfixturevalue("fresh_pg_url")

    with running_server(backend, db, data_dir, tmp_path / "server.log", umask=0) as srv:
        # a write, so the SQLite store has its -wal and -shm files while it serves
        created = httpx.post(
            f"{srv.url}/v1/namespaces/default/queues",
            json={"name": "private"},
            headers={"Authorization": f"Bearer {srv.admin_token}"},
        )
        assert created.status_code == 201, created.text
        assert _mode(parent) == 0o700
        assert _mode(data_dir) == 0o700
        assert _mode(srv.admin_token_path) == 0o600
        if backend == "sqlite":
            side_files = [sqlite_file.with_name(f"lakeshore.db{s}") for s in ("-wal", "-shm")]
            for path in (sqlite_file, *side_files):
                assert path.exists(), f"{path.name} missing"
                assert _mode(path) == 0o600, f"{path.name} is {oct(_mode(path))}"


def test_server_tightens_an_existing_sqlite_file_that_others_can_read(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    sqlite_file = tmp_path / "old.db"
    sqlite_file.touch()
    sqlite_file.chmod(0o644)  # as an earlier Lakeshore left it

    with running_server("sqlite", str(sqlite_file), data_dir, tmp_path / "server.log"):
        assert _mode(sqlite_file) == 0o600


def _start(data_dir: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``lakeshore server|up`` that must refuse to start: it is given no time to serve."""
    port = str(free_port())
    return subprocess.run(
        [str(LAKESHORE), *args, "--host", "127.0.0.1", "--port", port, "--data-dir", str(data_dir)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=clean_env(**env),
        timeout=CLI_TIMEOUT_S,
        check=False,
    )


@pytest.mark.parametrize("command", ["server", "up"])
def test_an_admin_token_shorter_than_16_characters_is_refused_at_start(
    command: str, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    done = _start(data_dir, command, LAKESHORE_ADMIN_TOKEN="sh0rt-t0ken")  # 11 characters

    assert done.returncode == 2, done.stdout + done.stderr  # a refused setting
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "LAKESHORE_ADMIN_TOKEN" in lines[0] and "at least 16" in lines[0]
    assert "sh0rt-t0ken" not in done.stdout + done.stderr  # a token is never echoed
    assert "Traceback" not in done.stderr
    assert not data_dir.exists()  # refused before touching the store


def test_an_admin_token_file_shorter_than_16_characters_is_refused_at_start(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "admin-token").write_text("tiny\n")

    done = _start(data_dir, "server", "--db", str(tmp_path / "lakeshore.db"))

    assert done.returncode == 1, done.stdout + done.stderr
    message = " ".join(done.stderr.split())
    assert "admin-token is 4 characters" in message and "at least 16" in message
    assert "Traceback" not in done.stderr
