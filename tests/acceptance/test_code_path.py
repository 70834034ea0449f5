"""Where a daemon finds user code, as the README's example has it: a module in the
directory the daemon (or ``lakeshore up``) was started in is importable by its UDFs with
no PYTHONPATH; ``--path`` points elsewhere; a module that is nowhere fails its invocation
once, saying where the daemon looked and how to fix it."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.acceptance.conftest import LAKESHORE, WIDE, LakeshoreServer, clean_env, free_port
from tests.acceptance.test_daemons import stop
from tests.acceptance.test_up_and_local import NS, elastic_queue, wait_for
from tests.acceptance.test_up_restart import up_on

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


def test_daemons_launched_by_up_import_from_up_s_working_directory(tmp_path: Path) -> None:
    """The README's example: ``square`` in a module where ``lakeshore up`` runs, a queue
    on the ``local`` provider, a submit: the launched daemon runs it."""
    (tmp_path / "usercode_up.py").write_text(MODULE)
    with up_on(tmp_path, free_port()) as up:
        up.post(f"{NS}/queues", elastic_queue("readme", 0, 1, providerRef="local"))
        sent = up.http.post(
            f"{NS}/queues/readme/invocations", json={"fn": "usercode_up:square", "args": [9]}
        )
        assert sent.status_code == 201, sent.text
        invocation = sent.json()["id"]

        def finished() -> dict[str, Any] | None:
            found: dict[str, Any] = up.http.get(f"{NS}/invocations/{invocation}").json()
            return found if found["state"] in ("succeeded", "failed") else None

        done = wait_for(finished, 90, "the invocation to finish")
        assert (done["state"], done["result"]) == ("succeeded", 81), done
