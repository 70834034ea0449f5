"""Real processes: a ``lakeshore server`` on a free loopback port, and the ``lakeshore`` CLI.

The ``server`` fixture starts one server per backend (SQLite file, fresh PostgreSQL
database) per test module, with ``LAKESHORE_ADMIN_TOKEN`` unset so the server makes its
own admin token in its data dir. Its output goes to a file; a failing test shows it.

The ``cli`` fixture runs the console script installed next to this interpreter, pointed at
that server through ``LAKESHORE_URL`` / ``LAKESHORE_TOKEN``, with ``LAKESHORE_DATA_DIR`` on a
scratch dir so it never finds the user's own admin token.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Generator, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest

from tests.conftest import BACKENDS, create_pg_database, drop_pg_database

LAKESHORE = Path(sys.executable).parent / "lakeshore"
# a hang guard, not a measure: a fresh PostgreSQL database runs every migration first, and
# on a loaded 2-core machine (load 12) a start took over 30 s
STARTUP_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
CLI_TIMEOUT_S = 30.0
WIDE = "1000"  # COLUMNS for child processes: rich wraps its output at 80 columns otherwise


def clean_env(**overrides: str | None) -> dict[str, str]:
    """This process's environment without any Lakeshore settings, plus ``overrides``
    (``None`` removes a variable)."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("LAKESHORE_", "ELASTICITY_"))
    }
    env["PYTHONUNBUFFERED"] = "1"
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class LakeshoreServer:
    backend: str
    url: str
    db: str
    data_dir: Path
    admin_token: str
    log_path: Path
    process: subprocess.Popen[bytes]

    @property
    def admin_token_path(self) -> Path:
        return self.data_dir / "admin-token"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


class _PortTaken(Exception):
    pass


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, a bounded wait, then SIGKILL: never leave the server behind."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=STOP_TIMEOUT_S)


def _wait_healthy(process: subprocess.Popen[bytes], url: str, log_path: Path, start: int) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            output = log_path.read_text(errors="replace")[start:]
            if "address already in use" in output.lower():
                raise _PortTaken
            pytest.fail(f"lakeshore server exited with {process.returncode}:\n{output}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    output = log_path.read_text(errors="replace")[start:]
    pytest.fail(f"lakeshore server not healthy after {STARTUP_TIMEOUT_S:.0f}s:\n{output}")


def _spawn(
    db: str, data_dir: Path, log_path: Path, env: Mapping[str, str], umask: int = -1
) -> tuple[subprocess.Popen[bytes], str]:
    """Start the server on a free port (a few tries, in case another process takes the
    port between our probe and the server's bind); return it once ``/healthz`` answers.
    ``umask`` is the server's (-1: this process's)."""
    for _ in range(3):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        args = [str(LAKESHORE), "server", "--host", "127.0.0.1", "--port", str(port)]
        args += ["--db", db, "--data-dir", str(data_dir), "--log-level", "info"]
        start = log_path.stat().st_size if log_path.exists() else 0
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                umask=umask,
            )
        try:
            _wait_healthy(process, url, log_path, start)
        except _PortTaken:
            _stop(process)
            continue
        except BaseException:
            _stop(process)
            raise
        return process, url
    pytest.fail(f"no free port for lakeshore server after 3 tries; see {log_path}")


@contextmanager
def running_server(
    backend: str,
    db: str,
    data_dir: Path,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    *,
    umask: int = -1,
) -> Iterator[LakeshoreServer]:
    """A ``lakeshore server`` process for the length of the block, stopped afterwards."""
    env = clean_env(COLUMNS=WIDE) if env is None else env
    assert "LAKESHORE_ADMIN_TOKEN" not in env
    process, url = _spawn(db, data_dir, log_path, env, umask)
    try:
        token = (data_dir / "admin-token").read_text().strip()
        yield LakeshoreServer(backend, url, db, data_dir, token, log_path, process)
    except BaseException:
        print(f"--- lakeshore server log ({backend}) ---\n{log_path.read_text(errors='replace')}")
        raise
    finally:
        _stop(process)


@pytest.fixture(scope="module", params=BACKENDS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LakeshoreServer]:
    """One real server per backend for the test module, on an empty store."""
    backend: str = request.param
    base = tmp_path_factory.mktemp(f"srv-{backend}")
    data_dir, log_path = base / "data", base / "server.log"
    if backend == "sqlite":
        with running_server(backend, str(base / "lakeshore.db"), data_dir, log_path) as srv:
            yield srv
        return
    # fresh_pg_url is per test; a module's server needs its database as long as it lives,
    # so this does what fresh_pg_url does, once per module.
    pg_server: str = request.getfixturevalue("pg_server")
    db_url = create_pg_database(pg_server)
    try:
        with running_server(backend, db_url, data_dir, log_path) as srv:
            yield srv
    finally:
        drop_pg_database(pg_server, db_url)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Attach the module server's log to a failing test's report."""
    report: pytest.TestReport = yield
    funcargs = getattr(item, "funcargs", {})
    srv = funcargs.get("server")
    if report.failed and report.when == "call" and isinstance(srv, LakeshoreServer):
        report.sections.append((f"lakeshore server log ({srv.backend})", srv.log()))
    return report


class Token(Enum):
    ADMIN = "admin"


class Result(NamedTuple):
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        assert self.returncode == 0, self.stderr
        return json.loads(self.stdout)

    @property
    def message(self) -> str:
        """stderr with its whitespace folded (rich wraps long lines)."""
        return " ".join(self.stderr.split())


@dataclass
class Cli:
    url: str
    admin_token: str | None
    scratch: Path

    def run(
        self,
        *args: str,
        env_extra: Mapping[str, str | None] | None = None,
        token: str | Token | None = Token.ADMIN,
        timeout: float = CLI_TIMEOUT_S,
    ) -> Result:
        """Run ``lakeshore *args``; ``token`` is the admin token unless given (``None``:
        no ``LAKESHORE_TOKEN`` at all)."""
        if token is Token.ADMIN:
            token = self.admin_token
        env = clean_env(
            LAKESHORE_URL=self.url,
            LAKESHORE_DATA_DIR=str(self.scratch),
            LAKESHORE_TOKEN=token if isinstance(token, str) else None,
            COLUMNS=WIDE,
        )
        for key, value in (env_extra or {}).items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        done = subprocess.run(
            [str(LAKESHORE), *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            check=False,
        )
        return Result(done.returncode, done.stdout, done.stderr)


@pytest.fixture
def scratch_dir(tmp_path: Path) -> Path:
    """An empty LAKESHORE_DATA_DIR for the CLI: no admin token to find there."""
    path = tmp_path / "cli-data"
    path.mkdir()
    return path


@pytest.fixture
def cli(server: LakeshoreServer, scratch_dir: Path) -> Cli:
    """The CLI pointed at the module's server, as the admin."""
    return Cli(server.url, server.admin_token, scratch_dir)


@pytest.fixture
def offline_cli(scratch_dir: Path) -> Cli:
    """The CLI pointed at a port nothing listens on, with no token."""
    return Cli("http://127.0.0.1:1", None, scratch_dir)
