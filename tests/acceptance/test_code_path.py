"""Where a daemon finds user code: a module in the directory the daemon was started in is
importable by its UDFs with no PYTHONPATH; ``--path`` points elsewhere; a module that is
nowhere fails its invocation once, saying where the daemon looked and how to fix it.
Daemons launched by ``lakeshore up`` import from its directory: see test_readme.py."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.acceptance.conftest import LAKESHORE, WIDE, LakeshoreServer, clean_env
from tests.acceptance.test_daemons import stop
from tests.acceptance.test_up_and_local import NS

pytestmark = pytest.mark.acceptance

MODULE = "def square(x):\n    return x * x\n"


@pytest.fixture
def http(server: LakeshoreServer) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {server.admin_token}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as client:
        yield client


def burst(server: LakeshoreServer, cwd: Path, log: Path, *args: str) -> int:
    """``lakeshore daemon run --burst`` started in ``cwd``, with no PYTHONPATH."""
    env = clean_env(LAKESHORE_URL=server.url, LAKESHORE_TOKEN=server.admin_token, COLUMNS=WIDE)
    env.pop("PYTHONPATH", None)
    with log.open("ab") as out:
        process = subprocess.Popen(
            [str(LAKESHORE), "daemon", "run", "--burst", *args],
            cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        return process.wait(timeout=120)
    finally:
        stop(process)


def submit(http: httpx.Client, queue: str, fn: str, *args: Any) -> str:
    response = http.post(f"{NS}/queues/{queue}/invocations", json={"fn": fn, "args": list(args)})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def final(http: httpx.Client, invocation: str) -> dict[str, Any]:
    found: dict[str, Any] = http.get(f"{NS}/invocations/{invocation}").json()
    return found


def test_a_module_where_the_daemon_starts_is_importable(
    server: LakeshoreServer, http: httpx.Client, tmp_path: Path
) -> None:
    (tmp_path / "usercode_here.py").write_text(MODULE)
    queue = f"here-{server.backend}"
    invocation = submit(http, queue, "usercode_here:square", 7)
    log = tmp_path / "d.log"
    assert burst(server, tmp_path, log, "--queue", queue) == 0, log.read_text()
    done = final(http, invocation)
    assert (done["state"], done["result"]) == ("succeeded", 49), done


def test_path_points_a_daemon_at_another_directory(
    server: LakeshoreServer, http: httpx.Client, tmp_path: Path
) -> None:
    code, elsewhere = tmp_path / "code", tmp_path / "elsewhere"
    code.mkdir()
    elsewhere.mkdir()
    (code / "usercode_there.py").write_text(MODULE)
    queue = f"there-{server.backend}"
    invocation = submit(http, queue, "usercode_there:square", 8)
    log = tmp_path / "d.log"
    args = ["--queue", queue, "--path", str(code)]
    assert burst(server, elsewhere, log, *args) == 0, log.read_text()
    assert final(http, invocation)["result"] == 64

    missing = burst(server, elsewhere, log, "--queue", queue, "--path", str(tmp_path / "no"))
    assert missing == 2 and "no such directory" in log.read_text()


def test_a_module_that_is_nowhere_fails_once_saying_where_the_daemon_looked(
    server: LakeshoreServer, http: httpx.Client, tmp_path: Path
) -> None:
    queue = f"nowhere-{server.backend}"
    invocation = submit(http, queue, "usercode_nowhere:square", 3)
    log = tmp_path / "d.log"
    assert burst(server, tmp_path, log, "--queue", queue) == 0, log.read_text()
    done = final(http, invocation)
    assert (done["state"], done["attempts"]) == ("failed", 1), done  # not retried
    message = done["error"]["message"]
    assert "No module named 'usercode_nowhere'" in message
    assert str(tmp_path) in message and "--path DIR" in message, message
