"""Streaming through a real server and daemon (both backends), and two server replicas on
one PostgreSQL database: a submit on one wakes a claim on the other, and concurrent claims
through both never hand one invocation to two workers."""

from __future__ import annotations

import collections
import itertools
import json
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest

from lakeshore.sdk import Client
from tests import udfs
from tests.acceptance.conftest import (
    LAKESHORE,
    WIDE,
    Cli,
    LakeshoreServer,
    _spawn,
    _stop,
    clean_env,
    running_server,
)
from tests.conftest import BACKENDS, create_pg_database, drop_pg_database

pytestmark = pytest.mark.acceptance

ROOT = Path(__file__).resolve().parents[2]
NS = "/v1/namespaces/default"


@pytest.fixture(scope="module", params=BACKENDS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LakeshoreServer]:
    backend: str = request.param
    base = tmp_path_factory.mktemp(f"stream-{backend}")
    if backend == "sqlite":
        with running_server(backend, str(base / "l.db"), base / "data", base / "server.log") as s:
            yield s
        return
    pg_server: str = request.getfixturevalue("pg_server")
    db_url = create_pg_database(pg_server)
    try:
        with running_server(backend, db_url, base / "data", base / "server.log") as s:
            yield s
    finally:
        drop_pg_database(pg_server, db_url)


@pytest.fixture(scope="module")
def daemon(server: LakeshoreServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One daemon for the module, serving "stream" and "sdk"; yields its log's path."""
    log = tmp_path_factory.mktemp(f"daemon-{server.backend}") / "daemon.log"
    env = clean_env(
        LAKESHORE_URL=server.url, LAKESHORE_TOKEN=server.admin_token, PYTHONPATH=str(ROOT)
    )
    args = ["daemon", "run", "-q", "stream", "-q", "sdk", "--capacity", "4"]
    with log.open("ab") as out:
        process = subprocess.Popen(
            [str(LAKESHORE), *args], cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        yield log
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=40)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


@pytest.fixture
def http(server: LakeshoreServer) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {server.admin_token}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as client:
        yield client


@pytest.fixture
def client(server: LakeshoreServer, daemon: Path) -> Iterator[Client]:
    with Client(server.url, server.admin_token) as sdk:
        yield sdk


def finished(client: Client, invocation_id: str, timeout_s: float = 60) -> dict[str, Any]:
    """Poll (bounded) until the invocation reaches a final state; return it."""
    deadline, info = time.monotonic() + timeout_s, {}
    while time.monotonic() < deadline:
        info = client.get(invocation_id)
        if info["state"] in ("succeeded", "failed", "cancelled", "expired"):
            return info
        time.sleep(0.1)
    pytest.fail(f"invocation {invocation_id} not finished after {timeout_s:.0f}s: {info}")


def follow_all(client: Client, invocation_id: str, after: int = -1) -> list[tuple[str, Any]]:
    with closing(client.follow(invocation_id, after=after)) as events:
        return list(itertools.islice(events, 100))


def test_items_arrive_while_the_invocation_still_runs(client: Client, tmp_path: Path) -> None:
    """A follower gets item 0 while the generator is blocked (still running), then the
    rest in order once it is released, and an end event with the final invocation."""
    gate = tmp_path / "gate"
    handle = client.submit("stream", "tests.udfs:gated", [5, str(gate)], max_attempts=1)
    with closing(client.follow(handle.id)) as events:
        bounded = itertools.islice(events, 100)
        assert next(bounded) == ("item", 0)
        assert client.get(handle.id)["state"] == "running"
        gate.touch()
        rest = list(bounded)
    assert rest[:-1] == [("item", i) for i in range(1, 5)]
    kind, end = rest[-1]
    assert kind == "end"
    assert (end["state"], end["result"]) == ("succeeded", "done")


def test_the_sdk_streams_items_and_raises_the_remote_error(client: Client) -> None:
    """``Handle.stream()`` yields a generator UDF's items; when it fails midway, the items
    before the failure come first, then the remote error is raised as its own type."""
    assert list(udfs.words.bind(client).submit("a b c").stream()) == ["a", "b", "c"]
    handle = client.submit("stream", "tests.udfs:fails_midway", max_attempts=1)
    seen: list[str] = []
    with pytest.raises(ValueError, match="midway"):
        for item in itertools.islice(handle.stream(), 100):
            seen.append(item)
    assert seen == ["a", "b"]


def parse_sse(text: str) -> list[dict[str, str]]:
    """Server-sent events as dicts of their fields (comments such as pings skipped)."""
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        fields = {}
        for line in block.split("\n"):
            if line and not line.startswith(":"):
                name, _, value = line.partition(":")
                fields[name] = value.removeprefix(" ")
        if fields:
            events.append(fields)
    return events


def test_a_stream_resumes_after_a_given_item(client: Client, http: httpx.Client) -> None:
    """A finished generator's stream can be re-read from any point: ``after=2`` gives items
    3 and 4 then the end; ``Last-Event-ID: 3`` gives item 4 then the end."""
    handle = client.submit("stream", "tests.udfs:count", [5], max_attempts=1)
    assert finished(client, handle.id)["state"] == "succeeded"
    events = follow_all(client, handle.id, after=2)
    assert events[:-1] == [("item", 3), ("item", 4)]
    assert events[-1][0] == "end" and events[-1][1]["result"] == 5
    response = http.get(f"{NS}/invocations/{handle.id}/stream", headers={"Last-Event-ID": "3"})
    assert response.status_code == 200, response.text
    raw = parse_sse(response.text)
    assert [(e["event"], e.get("id"), e["data"]) for e in raw[:-1]] == [("item", "4", "4")]
    assert raw[-1]["event"] == "end" and '"succeeded"' in raw[-1]["data"]


def test_the_cli_prints_a_stream_and_exits_by_its_outcome(client: Client, cli: Cli) -> None:
    """``lakeshore invocations stream``: one JSON line per item and exit 0 on success; exit
    1 with the error on stderr on failure; a one-line refusal for an unknown id."""
    ok = client.submit("stream", "tests.udfs:count", [3], max_attempts=1)
    bad = client.submit("stream", "tests.udfs:fails_midway", max_attempts=1)
    for handle in (ok, bad):
        finished(client, handle.id)
    done = cli.run("invocations", "stream", ok.id)
    assert (done.returncode, done.stdout.splitlines()) == (0, ["0", "1", "2"]), done.stderr
    failed = cli.run("invocations", "stream", bad.id)
    assert failed.returncode == 1
    assert failed.stdout.splitlines() == ['"a"', '"b"']
    assert "ValueError" in failed.message and "midway" in failed.message
    unknown = cli.run("invocations", "stream", "inv_nope")
    assert unknown.returncode != 0
    assert "not found" in unknown.message and "inv_nope" in unknown.message
    assert len(unknown.stderr.strip().splitlines()) == 1 and "Traceback" not in unknown.stderr


def test_oversized_results_items_and_payloads_are_refused(
    client: Client, http: httpx.Client
) -> None:
    """The caps hold end to end: a too-large result fails the invocation as ResultTooLarge
    without a retry; a too-large item fails it as StreamItemRejected, keeping the items
    before it; a too-large submit is refused with 413 naming the setting."""
    big = client.submit("stream", "tests.udfs:big_result", [600_000], max_attempts=3)
    info = finished(client, big.id)
    assert (info["state"], info["error"]["type"], info["attempts"]) == (
        "failed",
        "ResultTooLarge",
        1,
    )
    item = client.submit("stream", "tests.udfs:big_item", [600_000], max_attempts=3)
    info = finished(client, item.id)
    assert (info["state"], info["error"]["type"]) == ("failed", "StreamItemRejected"), info
    assert info["attempts"] == 1
    assert follow_all(client, item.id)[:-1] == [("item", "small")]
    body = {"fn": "tests.udfs:echo", "args": ["x" * (300 << 10)]}
    response = http.post(f"{NS}/queues/stream/invocations", json=body)
    assert response.status_code == 413, response.text
    assert "LAKESHORE_MAX_PAYLOAD_BYTES" in response.json()["error"]["message"]


# --- two replicas on one PostgreSQL database ---------------------------------------------


@pytest.fixture(scope="module")
def replicas(
    pg_server: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LakeshoreServer, str]]:
    """Servers A and B on one database, with the same admin token, and a 60 s claim
    re-check so only a wake-up ends a waiting claim early; yields A and B's URL."""
    base = tmp_path_factory.mktemp("replicas")
    db_url = create_pg_database(pg_server)
    env = clean_env(COLUMNS=WIDE, LAKESHORE_CLAIM_RECHECK_S="60")
    try:
        with running_server("postgresql", db_url, base / "a", base / "a.log", env) as a:
            env_b = {**env, "LAKESHORE_ADMIN_TOKEN": a.admin_token}
            process, url_b = _spawn(db_url, base / "b", base / "b.log", env_b)
            try:
                yield a, url_b
            except BaseException:
                print(f"--- server B log ---\n{(base / 'b.log').read_text(errors='replace')}")
                raise
            finally:
                _stop(process)
    finally:
        drop_pg_database(pg_server, db_url)


def hello(http: httpx.Client, queue: str, capacity: int = 1) -> str:
    body = {"queues": [queue], "capabilities": {"max_invocations": capacity}}
    response = http.post("/v1/workers/hello", json=body)
    assert response.status_code == 200, response.text
    return str(response.json()["id"])


def connect(url: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=40)


def test_a_submit_on_one_replica_wakes_a_claim_on_the_other(
    replicas: tuple[LakeshoreServer, str],
) -> None:
    """A claim waiting on B returns the invocation submitted on A: with a 60 s re-check
    and a 20 s claim, only A's NOTIFY reaching B can deliver it inside the claim."""
    a, url_b = replicas
    with connect(a.url, a.admin_token) as http_a, connect(url_b, a.admin_token) as http_b:
        worker = hello(http_b, "x")
        with ThreadPoolExecutor(1) as pool:
            claim = pool.submit(http_b.post, f"/v1/workers/{worker}/claim", json={"timeout_s": 20})
            time.sleep(0.5)  # let the claim find nothing and start waiting
            assert not claim.done()
            created = http_a.post(f"{NS}/queues/x/invocations", json={"fn": "tests.udfs:noop"})
            assert created.status_code == 201, created.text
            response = claim.result(timeout=40)
    assert response.status_code == 200, response.text
    assert [i["id"] for i in response.json()["invocations"]] == [created.json()["id"]]


def drain(url: str, token: str, worker: str) -> list[str]:
    """Claim (10 at a time, no waiting) and complete until nothing is left; the ids."""
    claimed: list[str] = []
    with connect(url, token) as http:
        for _ in range(500):
            response = http.post(f"/v1/workers/{worker}/claim", json={"timeout_s": 0, "max": 10})
            assert response.status_code == 200, response.text
            batch = [i["id"] for i in response.json()["invocations"]]
            if not batch:
                return claimed
            claimed += batch
            for iid in batch:
                path = f"/v1/workers/{worker}/invocations/{iid}/complete"
                done = http.post(path, json={"result": None})
                assert done.status_code == 200, done.text
    pytest.fail(f"worker {worker} still claiming after 500 rounds")


def test_concurrent_claims_on_two_replicas_never_share_an_invocation(
    replicas: tuple[LakeshoreServer, str],
) -> None:
    """300 invocations drained by 4 workers, 2 through each replica at once: every
    invocation is claimed exactly once and the queue counts 300 succeeded."""
    a, url_b = replicas
    token = a.admin_token
    with connect(a.url, token) as http_a:
        submitted: list[str] = []
        for _ in range(3):
            items = [{"fn": "tests.udfs:noop"} for _ in range(100)]
            response = http_a.post(f"{NS}/queues/y/invocations/batch", json={"invocations": items})
            assert response.status_code == 201, response.text
            submitted += [i["id"] for i in response.json()["invocations"]]
        urls = [a.url, a.url, url_b, url_b]
        workers = []
        for url in urls:
            with connect(url, token) as http:
                workers.append(hello(http, "y", capacity=10))
        start = threading.Barrier(len(workers), timeout=30)

        def run(url: str, worker: str) -> list[str]:
            start.wait()
            return drain(url, token, worker)

        with ThreadPoolExecutor(len(workers)) as pool:
            futures = [pool.submit(run, url, w) for url, w in zip(urls, workers, strict=True)]
            per_worker = [f.result(timeout=240) for f in futures]
        stats = http_a.get(f"{NS}/queues/y/stats").json()
    claims = collections.Counter(itertools.chain.from_iterable(per_worker))
    assert [iid for iid, n in claims.items() if n > 1] == []
    assert set(claims) == set(submitted) and len(submitted) == 300
    assert stats["byState"]["succeeded"] == 300, stats
    assert (stats["pending"], stats["running"]) == (0, 0), stats


def test_show_follow_prints_items_as_they_arrive_then_the_final_invocation(
    client: Client, cli: Cli, tmp_path: Path
) -> None:
    """``lakeshore invocations show ID --follow``: item 0 is printed while the generator
    still runs, the rest once it is released, then the invocation in its final state."""
    gate, out_path = tmp_path / "gate", tmp_path / "out"
    handle = client.submit("stream", "tests.udfs:gated", [3, str(gate)], max_attempts=1)
    env = clean_env(
        LAKESHORE_URL=cli.url, LAKESHORE_TOKEN=cli.admin_token, LAKESHORE_DATA_DIR=str(cli.scratch)
    )
    args = [str(LAKESHORE), "invocations", "show", handle.id, "--follow", "-o", "json"]
    with out_path.open("w") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 30
        while not out_path.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert out_path.read_text() == "0\n"
        assert client.get(handle.id)["state"] == "running"
        gate.touch()
        _, err = process.communicate(timeout=30)
    finally:
        process.kill()
        process.wait(timeout=10)
    assert process.returncode == 0, err
    first, second, rest = out_path.read_text().split("\n", 2)
    assert (first, second) == ("0", "1")
    assert rest.startswith("2\n")
    shown = json.loads(rest[2:])
    assert (shown["id"], shown["state"], shown["result"]) == (handle.id, "succeeded", "done")
    assert "succeeded" in err
    plain = cli.run("invocations", "show", handle.id)
    assert plain.returncode == 0 and "succeeded" in plain.stdout
