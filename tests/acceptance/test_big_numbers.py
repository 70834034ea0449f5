"""Integers past 64 bits arrive and come back as the same integers, through every door:
a single submit (reading the queue the first time, one statement after), a batch, the SDK with a
real daemon running the UDF (its result and a generator's items), and the CLI, on both
stores. orjson, which reads and writes most of these bodies, reads such an integer as a
float and refuses to write one."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest

from lakeshore.sdk import Client, LakeshoreClientError
from tests import udfs
from tests.acceptance.conftest import LAKESHORE, Cli, LakeshoreServer, clean_env

pytestmark = pytest.mark.acceptance

ROOT = Path(__file__).resolve().parents[2]
NS = "/v1/namespaces/default"
# past 64 bits both ways, and far past them
BIG = [2**64 + 1, -(2**63) - 1, int("7" * 300)]
FINAL = ("succeeded", "failed", "cancelled", "expired")


def exactly(got: Any, expected: Any) -> bool:
    """Equal, and integers where integers were expected (all the way down)."""
    if isinstance(expected, list):
        return (
            isinstance(got, list)
            and len(got) == len(expected)
            and all(exactly(g, e) for g, e in zip(got, expected, strict=True))
        )
    if isinstance(expected, dict):
        return (
            isinstance(got, dict)
            and got.keys() == expected.keys()
            and all(exactly(got[k], v) for k, v in expected.items())
        )
    return type(got) is type(expected) and got == expected


@pytest.fixture(scope="module")
def daemon(server: LakeshoreServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One daemon for the module, serving the "numbers" queue."""
    log = tmp_path_factory.mktemp(f"daemon-{server.backend}") / "daemon.log"
    env = clean_env(
        LAKESHORE_URL=server.url, LAKESHORE_TOKEN=server.admin_token, PYTHONPATH=str(ROOT)
    )
    args = ["daemon", "run", "-q", "numbers", "--capacity", "4"]
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
    deadline, info = time.monotonic() + timeout_s, {}
    while time.monotonic() < deadline:
        info = client.get(invocation_id)
        if info["state"] in FINAL:
            return info
        time.sleep(0.05)
    pytest.fail(f"invocation {invocation_id} not finished after {timeout_s:.0f}s: {info}")


def read(response: httpx.Response) -> Any:
    """An answer's JSON as Python's json reads it (exactly)."""
    return json.loads(response.content)


def test_single_submits_keep_big_integers_to_a_new_and_a_known_queue(
    http: httpx.Client,
) -> None:
    """The first submit to a new queue reads it, the next ones are one statement (its
    caller and queue are known by then): each stores the integers sent."""
    queue = f"held-single-{time.monotonic_ns()}"
    ids = []
    for attempt in range(3):
        body = {"fn": "tests.udfs:successor", "args": BIG, "kwargs": {"n": BIG[attempt]}}
        answer = http.post(f"{NS}/queues/{queue}/invocations", json=body)
        assert answer.status_code == 201, answer.text
        created = read(answer)
        assert exactly(created["args"], BIG) and exactly(created["kwargs"], {"n": BIG[attempt]})
        ids.append(created["id"])
    for attempt, invocation_id in enumerate(ids):
        stored = read(http.get(f"{NS}/invocations/{invocation_id}"))
        assert exactly(stored["args"], BIG), stored["args"]
        assert exactly(stored["kwargs"], {"n": BIG[attempt]})


def test_a_batch_submit_keeps_big_integers(http: httpx.Client) -> None:
    queue = f"held-batch-{time.monotonic_ns()}"
    body = {"invocations": [{"fn": "tests.udfs:successor", "args": [n]} for n in BIG]}
    answer = http.post(f"{NS}/queues/{queue}/invocations/batch", json=body)
    assert answer.status_code == 201, answer.text
    created = read(answer)["invocations"]
    assert [c["args"] for c in created] == [[n] for n in BIG]
    for item, n in zip(created, BIG, strict=True):
        assert exactly(read(http.get(f"{NS}/invocations/{item['id']}"))["args"], [n])


def test_the_sdk_sends_big_integers_and_reads_back_the_daemons_big_results(
    client: Client,
) -> None:
    """``Handle.result()``: the SDK writes the integer, the daemon reads it and writes
    ``x + 1``, the store keeps it, the SDK reads it back: all the same integer."""
    handles = [udfs.successor.bind(client).submit(n) for n in BIG]
    handles += [client.submit("numbers", "tests.udfs:successor", kwargs={"x": n}) for n in BIG]
    many = udfs.successor.bind(client).submit_many([[n] for n in BIG])
    for handle, n in zip(handles + many, BIG * 3, strict=True):
        assert exactly(handle.result(timeout=60), n + 1), handle.info()
        info = handle.info()
        assert exactly(info["args"] or [info["kwargs"]["x"]], [n])
    # a float with no fraction stays a float (SQLite once kept a bare 1.0 as the integer 1)
    for a, b in ((3.0, 3.0), (3e5, 1), (-0.0, 1)):
        assert exactly(client.submit("numbers", "tests.udfs:divide", [a, b]).result(60), a / b)


def test_the_sdk_sends_a_nan_for_the_server_to_refuse_by_name(client: Client) -> None:
    """Not as the ``null`` orjson would write, which the server would take."""
    for attempt in range(2):  # a new queue, then a known one
        with pytest.raises(LakeshoreClientError) as refused:
            client.submit("numbers", "tests.udfs:successor", [1, float("nan")])
        assert refused.value.status == 422 and "args[1]" in refused.value.message, attempt


def test_a_generators_big_items_stream_back_unchanged(
    client: Client, http: httpx.Client, cli: Cli
) -> None:
    """Items go from the daemon to the store and out as server-sent events: the SDK's
    ``stream()``, the raw events and the CLI's lines all hold the integers yielded."""
    for start in BIG:
        handle = udfs.count_from.bind(client).submit(start, 3)
        expected = [start, start + 1, start + 2]
        assert exactly(list(itertools.islice(handle.stream(), 10)), expected)
        assert exactly(finished(client, handle.id)["result"], start + 3)
        with closing(client.follow(handle.id)) as events:
            kinds = list(itertools.islice(events, 10))
        assert exactly([v for k, v in kinds if k == "item"], expected)
        raw = http.get(f"{NS}/invocations/{handle.id}/stream").text
        data = [json.loads(line[5:]) for line in raw.splitlines() if line.startswith("data:")]
        assert exactly(data[:3], expected)
        printed = cli.run("invocations", "stream", handle.id)
        assert printed.returncode == 0, printed.stderr
        assert exactly([json.loads(line) for line in printed.stdout.splitlines()], expected)


def test_the_cli_submits_and_shows_big_integers(client: Client, cli: Cli) -> None:
    for n in BIG:
        submitted = cli.run(
            "submit", "numbers", "tests.udfs:successor", "--arg", str(n), "--json"
        ).json()
        assert exactly(submitted["args"], [n])
        finished(client, submitted["id"])
        shown = cli.run("invocations", "show", submitted["id"], "--json").json()
        assert shown["state"] == "succeeded", shown
        assert exactly(shown["args"], [n]) and exactly(shown["result"], n + 1)
        table = cli.run("invocations", "show", submitted["id"])
        assert table.returncode == 0, table.stderr
        assert str(n + 1) in "".join(table.stdout.split()), table.stdout
    nan = cli.run("submit", "numbers", "tests.udfs:successor", "--arg", "NaN")
    assert nan.returncode != 0 and "args[0]" in nan.message and "Traceback" not in nan.stderr


def test_the_cli_refuses_json_it_cannot_read_in_a_line(offline_cli: Cli) -> None:
    """More digits than Python converts, or deeper than it reads: a usage error naming
    the option, before any request (the CLI points at a port nothing listens on)."""
    for text, words in (("1" * 5000, "4300"), ("[" * 100_000, "nested too deeply")):
        for option in ("--arg", "--kwarg"):
            value = text if option == "--arg" else f"n={text}"
            done = offline_cli.run("submit", "q", "m:f", option, value)
            assert done.returncode == 2, done.stderr
            assert option in done.message and words in done.message
            assert "Traceback" not in done.stderr
