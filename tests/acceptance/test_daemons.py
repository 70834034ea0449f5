"""Real daemons against a real server: results correct, each invocation completed once,
and a daemon killed mid-invocation loses nothing."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.acceptance.conftest import (
    LAKESHORE,
    WIDE,
    LakeshoreServer,
    clean_env,
    running_server,
)
from tests.conftest import BACKENDS, create_pg_database, drop_pg_database

pytestmark = pytest.mark.acceptance

ROOT = Path(__file__).resolve().parents[2]
LEASE_S = 5.0  # short, so a dead daemon's work is re-dispatched within seconds, and long
# enough that a heartbeat delayed by a busy shared machine does not lose a lease
NS = "/v1/namespaces/default"


@pytest.fixture(scope="module", params=BACKENDS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LakeshoreServer]:
    backend: str = request.param
    base = tmp_path_factory.mktemp(f"daemons-{backend}")
    env = clean_env(COLUMNS=WIDE, LAKESHORE_LEASE_S=str(LEASE_S), LAKESHORE_REAPER_INTERVAL_S="0.5")
    if backend == "sqlite":
        with running_server(
            backend, str(base / "l.db"), base / "data", base / "server.log", env
        ) as s:
            yield s
        return
    pg_server: str = request.getfixturevalue("pg_server")
    db_url = create_pg_database(pg_server)
    try:
        with running_server(backend, db_url, base / "data", base / "server.log", env) as s:
            yield s
    finally:
        drop_pg_database(pg_server, db_url)


@pytest.fixture
def http(server: LakeshoreServer) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {server.admin_token}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as client:
        yield client


def start_daemon(
    server: LakeshoreServer, log: Path, *args: str, **env_overrides: str | None
) -> subprocess.Popen[bytes]:
    env = clean_env(
        LAKESHORE_URL=server.url,
        LAKESHORE_TOKEN=server.admin_token,
        PYTHONPATH=str(ROOT),
        **env_overrides,
    )
    with log.open("ab") as out:
        return subprocess.Popen(
            [str(LAKESHORE), "daemon", "run", *args],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=40)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def all_invocations(http: httpx.Client, queue: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 1000}
        if cursor:
            params["cursor"] = cursor
        page = http.get(f"{NS}/queues/{queue}/invocations", params=params).json()
        found += page["invocations"]
        cursor = page["next_cursor"]
        if not cursor:
            return found


def wait_for(predicate: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}")


def test_two_daemons_run_a_thousand_invocations_each_exactly_once(
    server: LakeshoreServer, http: httpx.Client, tmp_path: Path
) -> None:
    queue = f"thousand-{server.backend}"
    ledger = tmp_path / "ledger.txt"  # one line per execution, from inside the UDF
    for start in range(0, 1000, 500):
        items = [
            {"fn": "tests.udfs:record", "args": [str(ledger), i]} for i in range(start, start + 500)
        ]
        response = http.post(f"{NS}/queues/{queue}/invocations/batch", json={"invocations": items})
        assert response.status_code == 201, response.text
    daemons = [
        start_daemon(
            server, tmp_path / f"daemon-{n}.log", "--queue", queue, "--capacity", "4", "--burst"
        )
        for n in range(2)
    ]
    try:
        for daemon in daemons:
            assert daemon.wait(timeout=300) == 0, (tmp_path / "daemon-0.log").read_text()
    finally:
        for daemon in daemons:
            stop(daemon)
    done = all_invocations(http, queue)
    assert len(done) == 1000
    assert all(i["state"] == "succeeded" for i in done)
    assert sorted(i["result"] for i in done) == list(range(1000))
    assert all(i["result"] == i["args"][1] for i in done)
    runs = Counter(int(line) for line in ledger.read_text().split())
    assert set(runs) == set(range(1000))
    # never two runs in one attempt (a second attempt only follows a lapsed lease: a
    # heartbeat held up longer than the lease on a busy machine)
    assert all(runs[i["result"]] <= i["attempts"] for i in done)
    assert len({i["worker"] for i in done}) == 2  # both daemons took part


def test_a_daemon_killed_mid_invocation_loses_nothing(
    server: LakeshoreServer, http: httpx.Client, tmp_path: Path
) -> None:
    queue = f"kill-{server.backend}"
    ledger = tmp_path / "ledger.txt"
    body = {"fn": "tests.udfs:record", "args": [str(ledger), 7, 3.0], "max_attempts": 3}
    created = http.post(f"{NS}/queues/{queue}/invocations", json=body).json()
    url = f"{NS}/invocations/{created['id']}"
    doomed = start_daemon(server, tmp_path / "doomed.log", "--queue", queue)
    try:
        running = wait_for(
            lambda: (r := http.get(url).json())["state"] == "running" and r, 30, "the claim"
        )
        wait_for(ledger.exists, 30, "the UDF to start")
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(timeout=10)
    finally:
        stop(doomed)
    rescuer = start_daemon(server, tmp_path / "rescuer.log", "--queue", queue)
    try:
        final = wait_for(
            lambda: (r := http.get(url).json())["state"] in ("succeeded", "failed") and r,
            60,
            "the invocation to finish elsewhere",
        )
    finally:
        stop(rescuer)
    assert final["state"] == "succeeded", final
    assert final["result"] == 7
    assert final["attempts"] == 2
    assert final["worker"] != running["worker"]


def gone(pid: int) -> bool:
    """Whether the process has ended (a zombie nobody reaped yet counts as ended)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return "\nState:\tZ" in status


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal: Linux")
def test_a_daemon_killed_with_sigkill_takes_its_hanging_child_along(
    server: LakeshoreServer, http: httpx.Client, tmp_path: Path
) -> None:
    queue = f"orphan-{server.backend}"
    pid_file = tmp_path / "child.pid"
    body = {"fn": "tests.udfs_burst:pid_then_hang", "args": [str(pid_file)], "max_attempts": 1}
    assert http.post(f"{NS}/queues/{queue}/invocations", json=body).status_code == 201
    daemon = start_daemon(server, tmp_path / "d.log", "--queue", queue)
    try:
        child = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), 30, "the UDF"))
        assert not gone(child)
        daemon.send_signal(signal.SIGKILL)
        daemon.wait(timeout=10)
        wait_for(lambda: gone(child), 10, f"the daemon's child {child} to die with it")
    finally:
        stop(daemon)
        if pid_file.exists() and not gone(pid := int(pid_file.read_text())):
            os.kill(pid, signal.SIGKILL)  # a failed check leaves nothing running


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal: Linux")
def test_a_daemon_killed_with_sigkill_takes_what_its_udf_started_along(
    server: LakeshoreServer, http: httpx.Client, tmp_path: Path
) -> None:
    """The UDF's own child (a ``sleep``, re-parented once its parent dies) goes too: the
    daemon's sentinel kills the invocation's process group."""
    queue = f"grandchild-{server.backend}"
    pid_file = tmp_path / "pids"
    body = {"fn": "tests.udfs_burst:spawn_then_wait", "args": [str(pid_file), 120]}
    assert http.post(
        f"{NS}/queues/{queue}/invocations", json={**body, "max_attempts": 1}
    ).is_success
    daemon = start_daemon(server, tmp_path / "d.log", "--queue", queue)
    pids: list[int] = []
    try:
        text = wait_for(
            lambda: (
                pid_file.exists()
                and len(pid_file.read_text().split()) == 2
                and pid_file.read_text()
            ),
            30,
            "the UDF",
        )
        pids = [int(p) for p in text.split()]
        assert not any(gone(pid) for pid in pids)
        daemon.send_signal(signal.SIGKILL)
        daemon.wait(timeout=10)
        for pid in pids:
            wait_for(lambda pid=pid: gone(pid), 10, f"process {pid} to die with the daemon")
    finally:
        stop(daemon)
        for pid in pids:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)  # a failed check leaves nothing running


def test_a_failing_udf_is_retried_then_failed_with_its_error(
    server: LakeshoreServer, http: httpx.Client, tmp_path: Path
) -> None:
    queue = f"fail-{server.backend}"
    items = [
        {"fn": "tests.udfs:boom", "kwargs": {"message": "bad input"}, "max_attempts": 2},
        {"fn": "tests.udfs:not_json", "max_attempts": 3},
        {"fn": "tests.nowhere:fn", "max_attempts": 1},
        {"fn": "tests.udfs:sleep", "args": [30], "timeout_s": 0.5, "max_attempts": 1},
        {"fn": "tests.udfs:crash", "max_attempts": 1},
    ]
    created = http.post(
        f"{NS}/queues/{queue}/invocations/batch", json={"invocations": items}
    ).json()
    daemon = start_daemon(server, tmp_path / "d.log", "--queue", queue, "--capacity", "2")
    try:
        ids = [i["id"] for i in created["invocations"]]
        results = wait_for(
            lambda: (
                all(
                    (r := [http.get(f"{NS}/invocations/{i}").json() for i in ids])[k]["state"]
                    == "failed"
                    for k in range(5)
                )
                and r
            ),
            60,
            "every invocation to fail",
        )
    finally:
        stop(daemon)
    boom, not_json, missing, slow, crashed = results
    assert (boom["attempts"], boom["error"]["type"], boom["error"]["message"]) == (
        2,
        "ValueError",
        "bad input",
    )
    assert "Traceback" in boom["error"]["traceback"]
    assert not_json["attempts"] == 1  # not retried: the same code gives the same result
    assert "not JSON-serialisable" in not_json["error"]["message"]
    assert missing["error"]["type"] == "ModuleNotFoundError"
    assert slow["error"]["type"] == "TimeoutError"
    assert crashed["error"]["type"] == "WorkerCrash"


def test_preloaded_modules_are_imported_by_each_child_before_its_first_invocation(
    server: LakeshoreServer, http: httpx.Client, tmp_path: Path
) -> None:
    queue = f"preload-{server.backend}"
    results = []
    for extra in ((), ("--preload", "tests.udfs_preloaded")):
        body = {"fn": "tests.udfs_pool:preloaded"}
        created = http.post(f"{NS}/queues/{queue}/invocations", json=body).json()
        daemon = start_daemon(server, tmp_path / "d.log", "--queue", queue, "--burst", *extra)
        try:
            assert daemon.wait(timeout=60) == 0, (tmp_path / "d.log").read_text()
        finally:
            stop(daemon)
        results.append(http.get(f"{NS}/invocations/{created['id']}").json()["result"])
    assert results == [None, True]  # not imported at all; imported in the child itself


def test_sigterm_lets_running_work_finish(
    server: LakeshoreServer, http: httpx.Client, tmp_path: Path
) -> None:
    queue = f"term-{server.backend}"
    body = {"fn": "tests.udfs:sleep", "args": [1.5]}
    created = http.post(f"{NS}/queues/{queue}/invocations", json=body).json()
    url = f"{NS}/invocations/{created['id']}"
    daemon = start_daemon(server, tmp_path / "d.log", "--queue", queue)
    try:
        wait_for(lambda: http.get(url).json()["state"] == "running", 30, "the claim")
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=30) == 0
    finally:
        stop(daemon)
    final = http.get(url).json()
    assert (final["state"], final["result"], final["attempts"]) == ("succeeded", 1.5, 1)
    assert "1 succeeded" in (tmp_path / "d.log").read_text()


def test_the_sdk_submits_and_gets_results_and_remote_errors(
    server: LakeshoreServer, tmp_path: Path
) -> None:
    import lakeshore
    from lakeshore import Client, RemoteError
    from lakeshore.sdk import LakeshoreClientError
    from tests import udfs

    with Client(server.url, server.admin_token) as client:
        cube, divide, unusual = (f.bind(client) for f in (udfs.cube, udfs.divide, udfs.unusual))
        assert cube(3) == 27  # a plain call still runs here
        handles = [cube.submit(i) for i in range(5)]
        same = cube.submit(2, _key=f"two-{server.backend}")
        again = cube.submit(2, _key=f"two-{server.backend}")
        assert same.id == again.id
        zero = divide.submit(1, b=0)
        odd = unusual.submit()
        # 1,001 calls: two batch requests, handles in the calls' order
        many = cube.submit_many([(i,) for i in range(1001)])
        quotients = divide.submit_many([(8,), (9,)], [{"b": 2}, {"b": 3}])
        with pytest.raises(ValueError, match="longer"):
            divide.submit_many([(1,)], [{"b": 1}, {"b": 2}])  # lengths must agree
        with pytest.raises(LakeshoreClientError, match="not a valid queue name") as refused:
            client.submit("bad name!", "tests.udfs:cube", [1])
        assert refused.value.status == 422
        daemon = start_daemon(server, tmp_path / "d.log", "--queue", "sdk", "--capacity", "2")
        try:
            assert [h.result(timeout=60) for h in handles] == [0, 1, 8, 27, 64]
            assert [many[i].result(timeout=60) for i in (0, 999, 1000)] == [0, 999**3, 1000**3]
            assert len({h.id for h in many}) == 1001
            assert [h.result(timeout=60) for h in quotients] == [4, 3]
            assert same.result(timeout=60) == 8
            with pytest.raises(ZeroDivisionError, match="division by zero"):
                zero.result(timeout=60)
            with pytest.raises(RemoteError, match="Unusual: very"):
                odd.result(timeout=60)
            assert zero.state() == "failed"
            # fan-out and fan-in: map's handles in order, gathered on their end events
            cubes = cube.map(range(12))
            assert lakeshore.gather(cubes, timeout=60) == [i**3 for i in range(12)]
            mixed = [*divide.map([6, 1], [3, 0]), odd]
            with pytest.raises(ZeroDivisionError):
                lakeshore.gather(mixed, timeout=60)  # the first error, in order
            two, by_zero, unusual_one = lakeshore.gather(mixed, return_exceptions=True)
            assert two == 2 and isinstance(by_zero, ZeroDivisionError)
            assert isinstance(unusual_one, RemoteError)
            # retry policies: the function's, and a submit's over it
            careful = udfs.careful_divide.bind(client)
            never = careful.submit(1, 0)  # ZeroDivisionError: never retried
            retried = careful.submit("a", 2)  # TypeError: retried, at once, to its third
            once = careful.submit("a", 2, _retry={"max_attempts": 1})
            with pytest.raises(ZeroDivisionError):
                never.result(timeout=60)
            with pytest.raises(TypeError):
                retried.result(timeout=60)
            with pytest.raises(TypeError):
                once.result(timeout=60)
            assert never.info()["attempts"] == 1
            assert (retried.info()["attempts"], retried.info()["retry"]["base_s"]) == (3, 0.0)
            assert once.info()["attempts"] == 1
            pair = [client.submit("sdk", "tests.udfs:sleep", [30]), cube.submit(4)]
            done, waiting = lakeshore.wait(pair, return_when=lakeshore.FIRST_COMPLETED)
            assert (done, waiting) == ([pair[1]], [pair[0]])
            done, waiting = lakeshore.wait(pair, timeout=0.5)
            assert (done, waiting) == ([], pair)  # the first is still sleeping
            pair[0].cancel()
        finally:
            stop(daemon)
        pending = cube.submit(9)
        with pytest.raises(TimeoutError):
            pending.result(timeout=0.2)
        pending.cancel()
        assert pending.state() == "cancelled"


def test_the_async_client_submits_streams_and_gathers(
    server: LakeshoreServer, tmp_path: Path
) -> None:
    """AsyncClient through the path a user takes: a real server, a real daemon, the
    same answers as the blocking Client (results, remote errors, streams, refusals,
    integers past 64 bits), and a @udf's asubmit and amap."""
    import lakeshore
    from lakeshore import RemoteError
    from lakeshore.sdk import LakeshoreClientError
    from tests import udfs

    async def scenario() -> None:
        async with lakeshore.AsyncClient(server.url, server.admin_token) as client:
            cube, divide = udfs.cube.bind(client), udfs.divide.bind(client)
            one = await cube.asubmit(3)
            keyed = await cube.asubmit(2, _key=f"async-two-{server.backend}")
            again = await cube.asubmit(2, _key=f"async-two-{server.backend}")
            assert keyed.id == again.id
            many = await cube.amap(range(1001))  # two batch requests, handles in order
            mixed = [
                *(await divide.amap([6, 1], [3, 0])),
                await client.submit("sdk", "tests.udfs:unusual"),
            ]
            big = await client.submit("sdk", "tests.udfs:echo", [2**64 + 1])
            counted = await client.submit("sdk", "tests.udfs:count", [4])
            with pytest.raises(LakeshoreClientError, match="not a valid queue name") as refused:
                await client.submit("bad name!", "tests.udfs:cube", [1])
            assert refused.value.status == 422
            daemon = start_daemon(server, tmp_path / "d.log", "--queue", "sdk", "--capacity", "2")
            try:
                assert await one.result(timeout=60) == 27
                assert await keyed.result(timeout=60) == 8
                assert [item async for item in counted.stream()] == [0, 1, 2, 3]
                results = await lakeshore.agather(many, timeout=120)
                assert results == [i**3 for i in range(1001)]
                assert (await big.result(timeout=60))["args"] == [2**64 + 1]
                with pytest.raises(ZeroDivisionError):
                    await lakeshore.agather(mixed, timeout=60)  # the first error, in order
                two, by_zero, odd = await lakeshore.agather(mixed, return_exceptions=True)
                assert two == 2 and isinstance(by_zero, ZeroDivisionError)
                assert isinstance(odd, RemoteError)
                assert await mixed[1].state() == "failed"
            finally:
                stop(daemon)
            pending = await cube.asubmit(9)
            with pytest.raises(TimeoutError):
                await pending.result(timeout=0.2)
            await pending.cancel()
            assert await pending.state() == "cancelled"

    asyncio.run(scenario())


def test_the_sdk_names_a_server_it_cannot_reach(tmp_path: Path) -> None:
    from lakeshore import Client

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with Client(url, "token") as client, pytest.raises(ConnectionError, match=url):
        client.submit("q", "tests.udfs:cube", [1])

    async def submit_async() -> None:
        import lakeshore

        async with lakeshore.AsyncClient(url, "token") as client:
            await client.submit("q", "tests.udfs:cube", [1])

    with pytest.raises(ConnectionError, match=url):
        asyncio.run(submit_async())


def test_submit_and_invocation_commands_through_the_cli(
    server: LakeshoreServer, http: httpx.Client, tmp_path: Path
) -> None:
    from tests.acceptance.conftest import Cli

    cli = Cli(server.url, server.admin_token, tmp_path)
    queue = f"cli-{server.backend}"
    submitted = cli.run(
        "submit",
        queue,
        "tests.udfs:echo",
        "--arg",
        "3",
        "--arg",
        "hello",
        "--kwarg",
        'x={"y": [1]}',
        "--key",
        "k1",
        "--json",
    ).json()
    assert (submitted["args"], submitted["kwargs"]) == ([3, "hello"], {"x": {"y": [1]}})
    again = cli.run("submit", queue, "tests.udfs:echo", "--key", "k1")
    assert again.stdout.strip() == submitted["id"]
    doomed = cli.run("submit", queue, "tests.udfs:echo").stdout.strip()
    assert cli.run("invocations", "cancel", doomed, "--json").json()["state"] == "cancelled"
    listed = cli.run("invocations", "list", queue, "--state", "pending", "--json").json()
    assert [i["id"] for i in listed] == [submitted["id"]]
    daemon = start_daemon(server, tmp_path / "d.log", "--queue", queue, "--burst")
    try:
        assert daemon.wait(timeout=60) == 0
    finally:
        stop(daemon)
    shown = cli.run("invocations", "show", submitted["id"], "--json").json()
    assert shown["result"] == {"args": [3, "hello"], "kwargs": {"x": {"y": [1]}}}
    refused = cli.run("submit", queue, "not-an-import-path")
    assert refused.returncode == 1
    assert "import path" in refused.message
    assert "Traceback" not in refused.stderr
    missing = cli.run("invocations", "show", "inv_nope")
    assert missing.returncode == 1 and "not found" in missing.message


def test_the_cli_retries_failed_invocations_by_id_and_by_state_and_cancels_in_bulk(
    server: LakeshoreServer, tmp_path: Path
) -> None:
    """Three invocations fail on a burst daemon and one succeeds. ``invocations retry``
    by id makes a failed one pending again (same id, one more attempt allowed) and
    reports the 409 of the succeeded one without stopping; ``--queue --state failed``
    retries the rest; ``cancel --queue --state pending`` cancels all three."""
    from tests.acceptance.conftest import Cli

    cli = Cli(server.url, server.admin_token, tmp_path)
    queue = f"retry-cli-{server.backend}"
    boom = ["submit", queue, "tests.udfs:boom", "--max-attempts", "1"]
    failing = [cli.run(*boom).stdout.strip() for _ in range(3)]
    fine = cli.run("submit", queue, "tests.udfs:noop").stdout.strip()
    daemon = start_daemon(server, tmp_path / "d.log", "--queue", queue, "--burst")
    try:
        assert daemon.wait(timeout=60) == 0
    finally:
        stop(daemon)
    before = cli.run("invocations", "show", failing[0], "--json").json()
    assert (before["state"], before["attempts"], before["max_attempts"]) == ("failed", 1, 1)

    by_id = cli.run("invocations", "retry", fine, failing[0])

    assert by_id.returncode == 1, by_id
    assert f"invocation {failing[0]} is pending" in by_id.stdout
    assert f"{fine}: invocation is succeeded" in by_id.message and "409" in by_id.message
    assert "Traceback" not in by_id.stdout + by_id.stderr
    again = cli.run("invocations", "show", failing[0], "--json").json()
    assert (again["id"], again["state"], again["error"]) == (failing[0], "pending", None)
    assert (again["attempts"], again["max_attempts"]) == (1, 2)

    bulk = cli.run("invocations", "retry", "--queue", queue, "--state", "failed", "--json")
    assert bulk.json() == {"touched": 2}
    pending = cli.run("invocations", "list", queue, "--state", "pending", "--json").json()
    assert {i["id"] for i in pending} == set(failing)

    cancelled = cli.run("invocations", "cancel", "--queue", queue, "--state", "pending")
    assert cancelled.returncode == 0, cancelled
    assert f"cancelled 3 pending invocation(s) of queue {queue}" in cancelled.stdout
    states = cli.run("invocations", "list", queue, "--json").json()
    assert sorted(i["state"] for i in states) == ["cancelled"] * 3 + ["succeeded"]
    one = cli.run("invocations", "retry", failing[1], "--json").json()
    assert (one["id"], one["state"]) == (failing[1], "pending")

    for misuse in (["retry"], ["retry", "--queue", queue], ["retry", fine, "--queue", queue]):
        refused = cli.run("invocations", *misuse)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused
    wrong_state = cli.run("invocations", "retry", "--queue", queue, "--state", "pending")
    assert wrong_state.returncode == 2 and "'pending' is not one of" in wrong_state.message
