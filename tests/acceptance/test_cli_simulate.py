"""`lakeshore simulate` as a user runs it: policies from a lakeshore.yaml side by side on
a synthetic day, a chart written to a file, bad input refused in one line, and a queue's
own history replayed from a real server."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.acceptance.conftest import Cli, LakeshoreServer
from tests.acceptance.test_daemons import start_daemon, stop

pytestmark = pytest.mark.acceptance

NS = "/v1/namespaces/default"
POLICIES = """\
queues:
  - name: elastic
    elasticity: {kind: fully_elastic, min: 0, max: 8}
  - name: warm
    elasticity: {kind: pool_with_threshold, min: 2, max: 8}
  - name: steady
    elasticity: {kind: fixed}
"""
DAY = ["--arrivals", "bursts:0.02,3h,200", "--service", "exp:20", "--duration", "12h"]


@pytest.fixture
def policies(tmp_path: Path) -> Path:
    path = tmp_path / "lakeshore.yaml"
    path.write_text(POLICIES)
    return path


def test_policies_of_a_file_meet_the_same_day_side_by_side(
    offline_cli: Cli, policies: Path, tmp_path: Path
) -> None:
    """No server is needed for a synthetic workload; every policy meets the same
    invocations; the elastic one scales with the bursts, the pool never goes below its
    min after its first launches, the fixed queue never moves; a PNG and an SVG chart."""
    chart = tmp_path / "day.png"
    found = offline_cli.run("simulate", "-f", str(policies), *DAY, "--plot", str(chart), "--json")
    report = found.json()
    by_name = {p["queue"]: p for p in report["policies"]}
    assert list(by_name) == ["elastic", "warm", "steady"]
    assert len({p["invocations"] for p in by_name.values()}) == 1
    assert report["workload"]["invocations"] == by_name["elastic"]["invocations"] > 0
    elastic, warm, steady = by_name["elastic"], by_name["warm"], by_name["steady"]
    assert elastic["launches"] > 0 and elastic["kills"] > 0 and elastic["peak_daemons"] <= 8
    assert warm["daemon_hours"] >= 2 * 12  # its min of two kept warm all day (from the start)
    assert warm["daemon_hours"] > elastic["daemon_hours"]
    assert (steady["launches"], steady["kills"], steady["daemon_hours"]) == (0, 0, 0.0)
    assert steady["served"] == 0  # a fixed queue with no daemons serves nothing
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    svg = tmp_path / "day.svg"
    table = offline_cli.run("simulate", "-f", str(policies), "-q", "warm", *DAY, "--plot", str(svg))
    assert table.returncode == 0, table.stderr
    assert "pool_with_threshold" in table.stdout and "fully_elastic" not in table.stdout
    assert "daemon-hours" in table.stdout and f"wrote {svg}" in table.stderr
    assert svg.read_text().lstrip().startswith("<?xml")


def test_the_same_seed_gives_the_same_answer_and_another_seed_another(
    offline_cli: Cli, policies: Path
) -> None:
    def run(seed: str) -> dict[str, object]:
        args = ["simulate", "-f", str(policies), "-q", "elastic", *DAY, "--seed", seed, "--json"]
        return dict(offline_cli.run(*args).json()["policies"][0])

    assert run("4") == run("4")
    assert run("4") != run("5")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--arrivals", "poisson:3"], "not an arrival pattern"),
        (["--arrivals", "constant:1", "--service", "normal:3"], "not a distribution"),
        (["--arrivals", "constant:1", "--duration", "0"], "more than 0 seconds"),
        (["--arrivals", "constant:1", "--plot", "out.pdf"], ".png or .svg"),
        (["--arrivals", "constant:1", "-q", "nope"], "no queue named nope"),
        (["--arrivals", "constant:1000", "--duration", "7d"], "more than 5,000,000"),
        ([], "needs --arrivals"),
        (["--from-server", "--arrivals", "constant:1", "-q", "elastic"], "not both"),
        (["--from-server"], "give --queue NAME once"),
    ],
)
def test_bad_input_is_one_clear_line(
    offline_cli: Cli, policies: Path, args: list[str], message: str
) -> None:
    found = offline_cli.run("simulate", "-f", str(policies), *args)
    assert found.returncode in (1, 2), found
    assert message in " ".join(found.stderr.split()), found.stderr
    assert "Traceback" not in found.stderr


def test_a_queue_with_a_custom_scaler_is_refused_with_its_reason(
    offline_cli: Cli, tmp_path: Path
) -> None:
    path = tmp_path / "custom.yaml"
    path.write_text("queues:\n  - name: c\n    customScalerUdf: 'mod:scale'\n")
    found = offline_cli.run("simulate", "-f", str(path), "--arrivals", "constant:1")
    assert found.returncode == 1 and "customScalerUdf" in found.stderr, found
    assert "Traceback" not in found.stderr


def test_a_queue_s_own_history_is_replayed_from_the_server(
    cli: Cli, server: LakeshoreServer, tmp_path: Path
) -> None:
    """Invocations submitted and run by a real daemon; ``--from-server`` reads their
    submit and run times back and plays them against the queue's own spec (and, with a
    file, against the file's)."""
    queue = f"replayed-{server.backend}"
    headers = {"Authorization": f"Bearer {server.admin_token}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as http:
        body = {"name": queue, "elasticity": {"kind": "fully_elastic", "min": 0, "max": 3}}
        assert http.post(f"{NS}/queues", json=body).status_code == 201
        items = [{"fn": "tests.udfs:sleep", "args": [0.2]} for _ in range(6)]
        sent = http.post(f"{NS}/queues/{queue}/invocations/batch", json={"invocations": items})
        assert sent.status_code in (200, 201), sent.text
    daemon = start_daemon(server, tmp_path / "d.log", "--queue", queue, "--burst")
    try:
        assert daemon.wait(timeout=120) == 0, (tmp_path / "d.log").read_text()
    finally:
        stop(daemon)

    own = cli.run("simulate", "--from-server", "-q", queue, "--since", "1h", "--json").json()
    assert own["workload"]["kind"] == "server" and own["workload"]["queue"] == queue
    assert own["workload"]["invocations"] == own["workload"]["runTimesKnown"] == 6
    [policy] = own["policies"]
    assert (policy["queue"], policy["kind"], policy["invocations"]) == (queue, "fully_elastic", 6)
    assert policy["launches"] >= 1 and policy["served"] == 6

    other = tmp_path / "other.yaml"
    other.write_text(POLICIES)
    compared = cli.run(
        "simulate", "--from-server", "-q", queue, "--since", "1h", "-f", str(other), "--json"
    ).json()
    assert [p["queue"] for p in compared["policies"]] == ["elastic", "warm", "steady"]
    assert {p["invocations"] for p in compared["policies"]} == {6}

    missing = cli.run("simulate", "--from-server", "-q", "no-such-queue", "--json")
    assert missing.returncode == 1 and "not found" in missing.stderr, missing
    assert "Traceback" not in json.dumps(missing.stderr)


def test_a_wait_target_is_played_and_every_policy_scored_against_hindsight(
    offline_cli: Cli, tmp_path: Path
) -> None:
    path = tmp_path / "wait.yaml"
    path.write_text(
        POLICIES + "  - name: wait\n    elasticity: {kind: wait_target, wait_s: 300, max: 8}\n"
    )
    args = ["simulate", "-f", str(path), *DAY, "--boot", "uniform:60,180", "--target-wait", "5m"]
    found = offline_cli.run(*args, "--json").json()
    target = found["target"]
    assert target["targetWaitS"] == 300.0
    assert len(target["hindsight"]["fleetPerHour"]) == 12
    assert target["hindsight"]["daemonHours"] > 0
    scores = target["policies"]
    assert len(scores) == len(found["policies"]) == 4
    assert all(0 <= s["windowsMet"] <= 1 and s["overHindsight"] >= 0 for s in scores)
    assert scores[2]["overHindsight"] == 0  # fixed: no daemon, nothing started
    wait = found["policies"][3]
    assert wait["kind"] == "wait_target" and wait["launches"] > 0
    shown = offline_cli.run(*args)
    assert "5-min windows" in shown.stdout
    assert "hindsight baseline" in shown.stdout + shown.stderr
