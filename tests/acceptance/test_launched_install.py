"""A launched cloud machine runs the server's exact code: the start-up script the ``ec2``
provider writes into an instance's user-data (and the one ``gce`` writes into its
metadata: the same script) is run here, in a scratch virtual environment standing in for
a fresh machine's ``python3``, against a real ``lakeshore server``. It fetches the server's
own wheel with the launch's worker token, checks its checksum, installs it with its
dependencies from the package index (no cloud SDK: a daemon needs none), and the daemon
says hello for its launch. The second script finds the same code installed and skips the
install, as on an image built with it. On that machine, with no extra installed, ``lakeshore
up`` runs work and refuses a cloud provider, naming the extra it needs.

The store plays no part here, so one backend (SQLite) serves; EC2 is moto's server and
GCE the suite's fake of its REST routes, both on 127.0.0.1.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import time
import venv
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest

from lakeshore.defaults import DIST_NAME
from lakeshore.distribution import Wheel, own_wheel
from lakeshore.providers.base import default_install_command
from tests.acceptance.conftest import (
    WIDE,
    LakeshoreServer,
    _stop,
    _wait_healthy,
    clean_env,
    free_port,
    running_server,
)
from tests.integration import gce_fake
from tests.integration.gce_fake import GceFake
from tests.moto_server import AMI, REGION

pytestmark = pytest.mark.acceptance

NS = "/v1/namespaces/default"
HELLO_TIMEOUT_S = 240.0  # a pip install with dependencies, then the daemon's start
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": REGION,
    "AWS_EC2_METADATA_DISABLED": "true",
}


@pytest.fixture(scope="module")
def gce() -> Iterator[GceFake]:
    with gce_fake.serve() as fake:
        yield fake


@pytest.fixture(scope="module")
def cloud_server(
    tmp_path_factory: pytest.TempPathFactory,
    moto_url: str,
) -> Iterator[LakeshoreServer]:
    base = tmp_path_factory.mktemp("install-srv")
    env = clean_env(COLUMNS=WIDE, **AWS_ENV)
    env["AWS_SHARED_CREDENTIALS_FILE"] = str(base / "no-credentials")
    env["AWS_CONFIG_FILE"] = str(base / "no-config")
    with running_server(
        "sqlite", str(base / "lakeshore.db"), base / "data", base / "server.log", env
    ) as srv:
        yield srv


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh machine's ``python3``: an empty virtual environment (with pip), and stand-ins
    for ``shutdown`` and ``poweroff`` that only write down that they were called."""
    root = tmp_path_factory.mktemp("machine")
    venv.EnvBuilder(with_pip=True).create(root / "venv")
    stubs = root / "stubs"
    stubs.mkdir()
    for tool in ("shutdown", "poweroff"):
        (stubs / tool).write_text(f'#!/bin/bash\necho "{tool} $*" >> "{root}/powered-off"\n')
        (stubs / tool).chmod(0o755)
    return root


def admin(server: LakeshoreServer) -> httpx.Client:
    headers = {"Authorization": f"Bearer {server.admin_token}"}
    return httpx.Client(base_url=server.url, headers=headers, timeout=30)


def launch(http: httpx.Client, queue: str, provider: dict[str, Any]) -> str:
    """Register ``provider``, a fixed queue on it, and launch one daemon by hand."""
    made = http.post(f"{NS}/providers", json=provider)
    assert made.status_code == 201, made.text
    spec = {
        "name": queue,
        "providerRef": provider["name"],
        "elasticity": {"kind": "fixed"},
        "daemonTemplate": {"capacity": 1},
    }
    assert http.post(f"{NS}/queues", json=spec).status_code == 201
    launched = http.post(f"{NS}/daemons", json={"queue": queue, "count": 1})
    assert launched.status_code == 201, launched.text
    [one] = launched.json()["launches"]
    assert one["state"] == "in_flight", one
    return str(one["launchId"])


def run_on_machine(
    machine: Path, script: str, server: LakeshoreServer, launch_id: str, name: str
) -> str:
    """Run ``script`` as the machine would, until its daemon says hello for ``launch_id``;
    then stop it. Returns what the script printed."""
    assert "lakeshore==" not in script and "'lakeshore'" not in script  # not the index's
    path = f"{machine / 'stubs'}:{machine / 'venv' / 'bin'}:/usr/bin:/bin"
    env = {"PATH": path, "HOME": str(machine), "LANG": "C.UTF-8"}
    log_path = machine / f"{name}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            ["bash", "-c", script],
            cwd=machine,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        with admin(server) as http:
            deadline = time.monotonic() + HELLO_TIMEOUT_S
            while time.monotonic() < deadline:
                daemons = http.get(f"{NS}/daemons").json()["daemons"]
                if any(d.get("launchId") == launch_id for d in daemons):
                    break
                assert process.poll() is None, log_path.read_text(errors="replace")
                time.sleep(0.5)
            else:
                pytest.fail(f"no hello in {HELLO_TIMEOUT_S}s: {log_path.read_text()[-3000:]}")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
    return log_path.read_text(errors="replace")


def installed(machine: Path, *names: str) -> dict[str, str | None]:
    """Which distributions the machine's python3 has, and their versions."""
    code = (
        "import importlib.metadata as m, json, sys\n"
        "def v(n):\n"
        "    try: return m.version(n)\n"
        "    except m.PackageNotFoundError: return None\n"
        "print(json.dumps({n: v(n) for n in sys.argv[1:]}))\n"
    )
    python = machine / "venv" / "bin" / "python3"
    done = subprocess.run(
        [str(python), "-c", code, *names], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    found: dict[str, str | None] = json.loads(done.stdout)
    return found


def test_ec2_then_gce_start_up_scripts_install_the_servers_wheel_and_say_hello(
    cloud_server: LakeshoreServer,
    machine: Path,
    moto_url: str,
    gce: GceFake,
) -> None:
    wheel = own_wheel()
    with admin(cloud_server) as http:
        ec2_launch = launch(
            http,
            "on-ec2",
            {
                "name": "aws",
                "kind": "ec2",
                "config": {
                    "region": REGION,
                    "endpoint_url": moto_url,
                    "image_id": AMI,
                    "instance_type": "t3.micro",
                },
            },
        )
    ec2 = boto3.client(
        "ec2",
        region_name=REGION,
        endpoint_url=moto_url,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    [reservation] = ec2.describe_instances(
        Filters=[{"Name": "tag:lakeshore-launch-id", "Values": [ec2_launch]}]
    )["Reservations"]
    instance_id = reservation["Instances"][0]["InstanceId"]
    user_data = ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
    script = base64.b64decode(user_data["UserData"]["Value"]).decode()
    assert f"/v1/dist/{wheel.filename}" in script and wheel.sha256 in script

    printed = run_on_machine(machine, script, cloud_server, ec2_launch, "ec2")
    versions = installed(machine, DIST_NAME, "boto3", "kubernetes", "google-cloud-compute")
    assert versions == {
        DIST_NAME: wheel.version,
        "boto3": None,  # the daemon's install pulls no cloud SDK
        "kubernetes": None,
        "google-cloud-compute": None,
    }, printed

    # the GCE provider writes the same script: on a machine that has this code already
    # (as an image built with it would), the install is skipped
    with admin(cloud_server) as http:
        gce_launch = launch(
            http,
            "on-gce",
            {
                "name": "gcp",
                "kind": "gce",
                "config": {
                    "project": "proj",
                    "zone": "europe-west1-b",
                    "image": "projects/proj/global/images/base",
                    "api_endpoint": gce.url,
                },
            },
        )
    [metadata] = gce.instances[next(iter(gce.instances))]["metadata"]["items"]
    gce_script = metadata["value"]
    assert f"--launch-id {gce_launch}" in gce_script
    printed = run_on_machine(machine, gce_script, cloud_server, gce_launch, "gce")
    assert f"{DIST_NAME} {wheel.version} ({wheel.sha256[:12]}) is installed" in printed


def test_a_wheel_that_does_not_match_its_checksum_is_not_installed(
    cloud_server: LakeshoreServer, machine: Path, tmp_path: Path
) -> None:
    """The script refuses a download whose SHA-256 is not the one it was written with."""
    wheel = own_wheel()
    forged = Wheel(wheel.filename, wheel.version, "0" * 64, wheel.data)
    script = "set -euo pipefail\n" + default_install_command(forged).replace(
        "python3 -c 'import sys; from lakeshore", "false && python3 -c 'import sys; from lakeshore"
    )
    env = {
        "PATH": f"{machine / 'venv' / 'bin'}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "LAKESHORE_URL": cloud_server.url,
        "LAKESHORE_TOKEN": cloud_server.admin_token,
    }
    done = subprocess.run(
        ["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert "does not match its checksum" in done.stderr, done.stderr


@pytest.fixture(scope="module")
def installed_machine(machine: Path) -> Path:
    """The machine with the server's wheel installed as a user would: no extras (a no-op
    when the start-up script test above installed it already)."""
    wheel = own_wheel()
    path = machine / wheel.filename
    path.write_bytes(wheel.data)
    pip = [str(machine / "venv" / "bin" / "python3"), "-m", "pip", "install", "--quiet"]
    done = subprocess.run([*pip, str(path)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return machine


def test_without_extras_up_runs_work_and_refuses_a_cloud_provider_naming_its_extra(
    installed_machine: Path, tmp_path: Path
) -> None:
    """``pip install lakeshore-queues`` with no extra: ``lakeshore up`` launches a local
    daemon that runs an invocation, and an ``ec2`` provider is refused, naming ``[aws]``."""
    lakeshore = installed_machine / "venv" / "bin" / "lakeshore"
    port = free_port()
    url, log_path = f"http://127.0.0.1:{port}", tmp_path / "up.log"
    args = [str(lakeshore), "up", "--port", str(port), "--data-dir", str(tmp_path / "data")]
    env = {
        "PATH": f"{installed_machine / 'venv' / 'bin'}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "ELASTICITY_INTERVAL_S": "0.3",
    }
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            args, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        _wait_healthy(process, url, log_path, 0)
        token = (tmp_path / "data" / "admin-token").read_text().strip()
        with httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30
        ) as http:
            ec2 = {"name": "aws", "kind": "ec2", "config": {"region": REGION}}
            refused = http.post(f"{NS}/providers", json=ec2)
            assert refused.status_code == 422, refused.text
            assert "pip install 'lakeshore-queues[aws]'" in refused.json()["error"]["message"]
            queue = {
                "name": "plain",
                "providerRef": "local",
                "elasticity": {"kind": "fully_elastic", "min": 0, "max": 1},
            }
            assert http.post(f"{NS}/queues", json=queue).status_code == 201
            sent = http.post(
                f"{NS}/queues/plain/invocations", json={"fn": "json:dumps", "args": [[1, 2]]}
            )
            assert sent.status_code == 201, sent.text
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                found = http.get(f"{NS}/invocations/{sent.json()['id']}").json()
                if found["state"] in ("succeeded", "failed"):
                    break
                time.sleep(0.3)
            assert (found["state"], found["result"]) == ("succeeded", "[1, 2]"), found
    except BaseException:
        print(log_path.read_text(errors="replace"))
        raise
    finally:
        _stop(process)
