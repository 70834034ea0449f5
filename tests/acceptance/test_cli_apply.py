"""``lakeshore apply -f`` against a real ``lakeshore server``, on SQLite and PostgreSQL.

Each test applies into a namespace of its own, so the tests hold in any order against the
module's server. The example file at the repository root is applied as it ships.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.acceptance.conftest import Cli, LakeshoreServer, Result

pytestmark = pytest.mark.acceptance

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = (ROOT / "lakeshore.yaml").read_text()
EXAMPLE_QUEUES = {"nightly-batch", "burst", "embed-small", "embed-large"}

FIXED = """
providers:
  - name: fk
    kind: fake
    config: {launch_ttl_s: 3600}
queues:
  - name: batch
    providerRef: fk
    elasticity: {kind: fixed}
daemons:
  - queue: batch
    count: COUNT
"""


@pytest.fixture
def http(server: LakeshoreServer) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {server.admin_token}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as client:
        yield client


@pytest.fixture
def ns(http: httpx.Client) -> str:
    """A fresh namespace for this test."""
    name = f"apply-{secrets.token_hex(4)}"
    response = http.post("/v1/namespaces", json={"name": name})
    assert response.status_code == 201, response.text
    return name


class Applier:
    def __init__(self, cli: Cli, http: httpx.Client, ns: str, tmp_path: Path) -> None:
        self.cli, self.http, self.ns, self.tmp_path = cli, http, ns, tmp_path

    def write(self, text: str, name: str = "lakeshore.yaml") -> Path:
        path = self.tmp_path / name
        path.write_text(text)
        return path

    def apply(self, text: str, *flags: str) -> Result:
        path = self.write(text)
        return self.cli.run("--namespace", self.ns, "apply", "-f", str(path), *flags)

    def get(self, *segments: str, **params: Any) -> Any:
        path = "/".join(["/v1/namespaces", self.ns, *segments])
        response = self.http.get(path, params=params)
        assert response.status_code == 200, response.text
        return response.json()

    def queues(self) -> dict[str, Any]:
        return {q["name"]: q for q in self.get("queues", include_archived="true")["queues"]}

    def providers(self) -> dict[str, Any]:
        return {p["name"]: p for p in self.get("providers")["providers"]}

    def launches(self, provider: str) -> list[Any]:
        found: list[Any] = self.get("providers", provider, "launches")["launches"]
        return found

    def daemons(self, queue: str) -> list[Any]:
        found = self.get("daemons", queue=queue)["daemons"]
        return [d for d in found if not d["retiring"]]

    def hello(self, queue: str, launch_id: str | None = None) -> str:
        body: dict[str, Any] = {"namespace": self.ns, "queues": [queue]}
        if launch_id:
            body["launch_id"] = launch_id
        response = self.http.post("/v1/workers/hello", json=body)
        assert response.status_code == 200, response.text
        worker_id: str = response.json()["id"]
        return worker_id


@pytest.fixture
def applier(cli: Cli, http: httpx.Client, ns: str, tmp_path: Path) -> Applier:
    return Applier(cli, http, ns, tmp_path)


def lines(result: Result) -> list[str]:
    assert result.returncode == 0, result
    return result.stdout.splitlines()


def no_traceback(result: Result) -> None:
    assert "Traceback" not in result.stdout + result.stderr, result


def test_the_example_is_created_then_reported_unchanged(applier: Applier) -> None:
    first = lines(applier.apply(EXAMPLE))
    assert "+ provider sandbox (fake)" in first
    assert "+ queue burst (priority, fully_elastic)" in first
    assert "+ 2 daemons for queue nightly-batch (0 → 2, through sandbox)" in first
    queues = applier.queues()
    assert set(queues) == EXAMPLE_QUEUES
    assert queues["embed-small"]["elasticity"]["kind"] == "pool_with_threshold"
    assert queues["embed-small"]["elasticity"] == queues["embed-large"]["elasticity"]
    assert queues["burst"]["admission"] == {"max_depth": 10000, "on_full": "reject"}
    assert len(applier.launches("sandbox")) == 2

    providers_before = applier.providers()
    second = applier.apply(EXAMPLE)
    assert all(line.startswith("= ") for line in lines(second)), second.stdout
    assert len(lines(second)) == 6
    assert "nothing to change (6 unchanged)" in second.message
    assert applier.queues() == queues  # updatedAt included: nothing was written
    assert applier.providers() == providers_before
    assert len(applier.launches("sandbox")) == 2


def test_editing_one_field_patches_exactly_that_field(applier: Applier) -> None:
    lines(applier.apply(EXAMPLE))
    before = applier.queues()
    edited = EXAMPLE.replace("      max: 8\n", "      max: 12\n")
    assert edited != EXAMPLE
    changed = [line for line in lines(applier.apply(edited)) if not line.startswith("= ")]
    assert changed == ["~ queue burst: elasticity.max 8 → 12"]
    after = applier.queues()
    assert after["burst"]["elasticity"] == {**before["burst"]["elasticity"], "max": 12}
    assert {k: v for k, v in after["burst"].items() if k not in ("elasticity", "updatedAt")} == {
        k: v for k, v in before["burst"].items() if k not in ("elasticity", "updatedAt")
    }
    for name in EXAMPLE_QUEUES - {"burst"}:
        assert after[name] == before[name]
    again = lines(applier.apply(edited))
    assert all(line.startswith("= ") for line in again)


def test_dry_run_prints_the_plan_and_changes_nothing(applier: Applier) -> None:
    result = applier.apply(EXAMPLE, "--dry-run")
    assert "+ queue nightly-batch (fifo, fixed)" in lines(result)
    assert "nothing sent" in result.message
    assert applier.queues() == {}
    assert applier.providers() == {}

    lines(applier.apply(EXAMPLE))
    before = applier.queues()
    edited = EXAMPLE.replace("count: 2", "count: 5").replace("max: 8\n", "max: 9\n")
    planned = lines(applier.apply(edited, "--dry-run"))
    assert "~ queue burst: elasticity.max 8 → 9" in planned
    assert "+ 3 daemons for queue nightly-batch (2 → 5, through sandbox)" in planned
    assert applier.queues() == before
    assert len(applier.launches("sandbox")) == 2


def test_json_prints_the_plan_and_its_results(applier: Applier) -> None:
    planned = applier.apply(EXAMPLE, "--dry-run", "--json").json()
    assert planned["dryRun"] is True
    assert planned["namespace"] == applier.ns
    assert {c["status"] for c in planned["changes"]} == {"planned"}
    done = applier.apply(EXAMPLE, "--json").json()
    assert done["ok"] is True
    launch = next(c for c in done["changes"] if c["action"] == "launch")
    assert launch["status"] == "done"
    assert len(launch["launches"]) == 2
    again = applier.apply(EXAMPLE, "--json").json()
    assert {c["action"] for c in again["changes"]} == {"unchanged"}


def test_an_invalid_file_names_line_and_field_and_creates_nothing(applier: Applier) -> None:
    bad = EXAMPLE.replace("kind: fully_elastic", "kind: fully-elastic")
    line = bad.splitlines().index("      kind: fully-elastic") + 1
    result = applier.apply(bad)
    assert result.returncode == 1, result
    no_traceback(result)
    assert result.stdout == ""
    path = applier.tmp_path / "lakeshore.yaml"
    assert result.message == (
        f'error: {path}:{line}: queues[1].elasticity.kind: "fully-elastic" is the CLI '
        'spelling; the API and lakeshore.yaml take the underscored form "fully_elastic"'
    )
    assert applier.queues() == {}
    assert applier.providers() == {}


def test_a_problem_found_against_the_server_changes_nothing(applier: Applier) -> None:
    text = FIXED.replace("COUNT", "1") + "  - {queue: ghost, count: 1}\n"
    result = applier.apply(text)
    assert result.returncode == 1, result
    no_traceback(result)
    assert ':13: daemons[1].queue: queue "ghost" is neither declared' in result.message
    assert applier.providers() == {}
    assert applier.queues() == {}


def test_a_compose_count_launches_through_a_fake_provider(applier: Applier) -> None:
    result = lines(applier.apply(FIXED.replace("COUNT", "2")))
    assert "+ 2 daemons for queue batch (0 → 2, through fk)" in result
    launches = applier.launches("fk")
    assert len(launches) == 2
    assert {launch["scope"] for launch in launches} == {"batch"}
    again = lines(applier.apply(FIXED.replace("COUNT", "2")))
    assert "= 2 daemons for queue batch (unchanged)" in again
    assert len(applier.launches("fk")) == 2


def test_lowering_the_count_retires_idle_extras(applier: Applier) -> None:
    lines(applier.apply(FIXED.replace("COUNT", "3")))
    workers = [applier.hello("batch", launch["id"]) for launch in applier.launches("fk")]
    assert len(applier.daemons("batch")) == 3

    result = lines(applier.apply(FIXED.replace("COUNT", "1")))
    retired = [line for line in result if line.startswith("- daemon ")]
    assert len(retired) == 2
    left = applier.daemons("batch")
    assert len(left) == 1
    assert left[0]["id"] in workers
    assert all(left[0]["id"] not in line for line in retired)
    terminated = [launch for launch in applier.launches("fk") if launch["terminated_at"]]
    assert len(terminated) == 2
    assert "= 1 daemon for queue batch (unchanged)" in lines(
        applier.apply(FIXED.replace("COUNT", "1"))
    )


def test_a_busy_daemon_is_kept_and_reported(applier: Applier) -> None:
    lines(applier.apply(FIXED.replace("COUNT", "0")))
    worker = applier.hello("batch")
    submitted = applier.http.post(
        f"/v1/namespaces/{applier.ns}/queues/batch/invocations", json={"fn": "tests.udfs:add"}
    )
    assert submitted.status_code == 201, submitted.text
    claimed = applier.http.post(f"/v1/workers/{worker}/claim", json={"timeout_s": 0})
    assert claimed.status_code == 200, claimed.text
    assert len(claimed.json()["invocations"]) == 1

    result = applier.apply(FIXED.replace("COUNT", "0"))
    assert result.returncode == 0, result
    assert (
        "! 1 daemon over the count of 0 for queue batch kept (1 running invocations); "
        "only idle daemons are retired: apply again later"
    ) in lines(result)
    assert [d["id"] for d in applier.daemons("batch")] == [worker]
