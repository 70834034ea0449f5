"""What a ``lakeshore server`` process leaves on disk.

The data dir (and any folder the server creates for it) is 0700 and the SQLite file with
its ``-wal``/``-shm`` files 0600 even under ``umask 000``.
"""

from __future__ import annotations

import stat
from pathlib import Path

import httpx
import pytest

from tests.acceptance.conftest import running_server
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
