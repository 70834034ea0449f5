"""The ``gce`` provider end to end: the real google-cloud-compute client against a small HTTP
fake of the ``compute/v1`` instances routes on 127.0.0.1 (``gce_fake``), through the
provider class and through the controller over the API, with its faults."""

from __future__ import annotations

import asyncio
import shlex
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager

from lakeshore.api.app import create_app
from lakeshore.config import Settings
from lakeshore.distribution import own_wheel
from lakeshore.domain.fleet import LaunchBody
from lakeshore.providers import LaunchError, LaunchRequest, base, build
from lakeshore.providers.gce import (
    GceConfig,
    GceProvider,
    instance_labels,
    instance_name,
    instance_spec,
    label_key,
)
from tests.conftest import ADMIN, FakeClock
from tests.integration import gce_fake
from tests.integration.gce_fake import GceFake
from tests.integration.launches import assert_failed_and_released
from tests.integration.test_api_auth import namespace_token

NS = "/v1/namespaces/default"
TICK = "/v1/admin/elasticity/tick"
PROJECT, ZONE = "proj", "us-central1-a"
IMAGE = "projects/debian-cloud/global/images/family/debian-12"


@pytest.fixture(scope="module")
def gce_server() -> Iterator[GceFake]:
    with gce_fake.serve() as fake:
        yield fake


@pytest.fixture
def gce(gce_server: GceFake) -> GceFake:
    gce_server.reset()
    return gce_server


def closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def config(endpoint: str | None, **extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"project": PROJECT, "zone": ZONE, "image": IMAGE}
    if endpoint is not None:
        base["api_endpoint"] = endpoint
    return {**base, **extra}


def request(launch_id: str = "lch_0123abcd", **body: Any) -> LaunchRequest:
    launch_body = LaunchBody(queues=("q",), **body)
    return LaunchRequest(launch_id, "default", "q", "http://lakeshore.test", "lks-tok", launch_body)


def startup_script(instance: dict[str, Any]) -> str:
    [item] = [i for i in instance["metadata"]["items"] if i["key"] == "startup-script"]
    return str(item["value"])


# --- the provider class against the fake ------------------------------------------------


async def test_launch_inserts_an_instance_built_from_the_template(gce: GceFake) -> None:
    provider = build(
        "g",
        "gce",
        config(
            gce.url,
            network="vpc-1",
            subnetwork="workers",
            service_account="runner@proj.iam.gserviceaccount.com",
            extra_labels={"cost-center": "ml"},
            install_command="pip install lakeshore",
        ),
    )
    launch = request(
        instance_type="n2-standard-4",
        image_id="projects/my-proj/global/images/lakeshore-base",
        cloud_tags={"Team": "ML Ops"},
        setup_commands=("echo ready",),
    )
    handle = await provider.launch(launch)
    assert handle == {"instance": "lakeshore-lch-0123abcd", "project": PROJECT, "zone": ZONE}
    instance = gce.instance("lakeshore-lch-0123abcd")
    assert instance["machineType"] == f"zones/{ZONE}/machineTypes/n2-standard-4"
    [disk] = instance["disks"]
    assert disk["boot"] and disk["autoDelete"]
    assert (
        disk["initializeParams"]["sourceImage"] == "projects/my-proj/global/images/lakeshore-base"
    )
    [nic] = instance["networkInterfaces"]
    assert nic["network"] == "global/networks/vpc-1"
    assert nic["subnetwork"] == "regions/us-central1/subnetworks/workers"
    assert nic["accessConfigs"] == [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}]
    assert instance["labels"] == {
        "cost-center": "ml",
        "team": "ml-ops",
        "lakeshore-launch-id": "lch_0123abcd",
        "lakeshore-namespace": "default",
        "lakeshore-scope": "q",
    }
    assert startup_script(instance) == launch.startup_script("pip install lakeshore")
    assert "echo ready\n" in startup_script(instance)
    assert "\npip install lakeshore\npython3 -m lakeshore daemon run" in startup_script(instance)
    assert instance["serviceAccounts"][0]["email"] == "runner@proj.iam.gserviceaccount.com"
    [seen] = gce.requests
    assert (seen.method, seen.path) == (
        "POST",
        f"/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances",
    )
    assert "Authorization" not in seen.headers  # anonymous credentials


async def test_config_defaults_fill_what_the_template_leaves_out(gce: GceFake) -> None:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import compute_v1

    provider = build("g", "gce", config(gce.url, external_ip=False))
    await provider.launch(request())
    instance = gce.instance("lakeshore-lch-0123abcd")
    assert instance["machineType"] == f"zones/{ZONE}/machineTypes/e2-medium"
    assert instance["disks"][0]["initializeParams"]["sourceImage"] == IMAGE
    assert instance["networkInterfaces"] == [{"network": "global/networks/default"}]
    assert "serviceAccounts" not in instance
    # the default install fetches this server's own wheel from the control plane
    assert base.default_install_command() in startup_script(instance)
    assert f"/v1/dist/{own_wheel().filename}" in startup_script(instance)
    # the fake's list and get routes answer what the real client reads back
    anonymous = AnonymousCredentials()  # type: ignore[no-untyped-call]
    client = compute_v1.InstancesClient(
        credentials=anonymous, client_options={"api_endpoint": gce.url}
    )
    with client:
        listed = list(client.list(project=PROJECT, zone=ZONE))
        fetched = client.get(project=PROJECT, zone=ZONE, instance="lakeshore-lch-0123abcd")
    mine = [i.name for i in listed if i.labels.get("lakeshore-launch-id") == "lch_0123abcd"]
    assert mine == ["lakeshore-lch-0123abcd"]
    assert fetched.metadata.items[0].value == startup_script(instance)


async def test_terminate_deletes_and_a_missing_instance_is_fine(gce: GceFake) -> None:
    provider = build("g", "gce", config(gce.url))
    handle = await provider.launch(request())
    other = await provider.launch(request("lch_other"))
    await provider.terminate(handle, "wrk_1")
    assert gce.names() == [other["instance"]]
    await provider.terminate(handle, "wrk_1")  # 404 from the API: already gone
    deletes = [r for r in gce.requests if r.method == "DELETE"]
    assert [r.path.rsplit("/", 1)[1] for r in deletes] == ["lakeshore-lch-0123abcd"] * 2


async def test_terminate_refuses_a_handle_that_is_not_a_gce_one(gce: GceFake) -> None:
    provider = build("g", "gce", config(gce.url))
    with pytest.raises(LaunchError, match="not a gce handle"):
        await provider.terminate({"fake": "lch_1"}, "wrk_1")
    assert gce.requests == []


async def test_no_image_anywhere_fails_before_any_call(gce: GceFake) -> None:
    provider = build("g", "gce", {"project": PROJECT, "zone": ZONE, "api_endpoint": gce.url})
    with pytest.raises(LaunchError, match=r"no image to boot: set daemonTemplate\.image_id"):
        await provider.launch(request())
    assert gce.requests == []


GOOGLE_500 = {"error": {"code": 500, "message": "backend exploded", "errors": []}}


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (500, GOOGLE_500, "the Compute Engine API answered 500 POST .*: backend exploded"),
        (503, b"<html>down</html>", "the Compute Engine API answered 503"),
        (200, b"<html>surprise</html>", r"not a Compute Engine answer \(Failed to load JSON"),
        (200, b'{"name": 5}', r"not a Compute Engine answer \(Failed to parse name field"),
        (200, b"{}", r"not a Compute Engine answer \(no operation name\)"),
        (
            200,
            {
                "name": "op-1",
                "error": {"errors": [{"code": "QUOTA_EXCEEDED", "message": "no CPUs"}]},
            },
            "the operation failed: no CPUs",
        ),
    ],
)
async def test_api_errors_and_garbage_are_launch_errors(
    gce: GceFake, status: int, body: bytes | dict[str, Any], message: str
) -> None:
    gce.fail_with(status, body)
    provider = build("g", "gce", config(gce.url))
    with pytest.raises(LaunchError, match=f"^GCE insert of lakeshore-lch-0123abcd: {message}"):
        await provider.launch(request())


async def test_a_failing_delete_is_a_launch_error(gce: GceFake) -> None:
    provider = build("g", "gce", config(gce.url))
    handle = await provider.launch(request())
    gce.fail_with(500, GOOGLE_500)
    with pytest.raises(LaunchError, match=r"^GCE delete of lakeshore-lch-0123abcd: .*500"):
        await provider.terminate(handle, "wrk_1")


async def test_an_unreachable_endpoint_is_a_launch_error() -> None:
    provider = build("g", "gce", config(f"http://127.0.0.1:{closed_port()}"))
    with pytest.raises(LaunchError, match=r"cannot reach the Compute Engine API: .*refused"):
        await provider.launch(request())


@pytest.fixture
def no_metadata_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """Google's credential lookup asks the GCE metadata server last; point it at a closed
    local port so it is refused at once instead of timing out on 169.254.169.254."""
    closed = f"127.0.0.1:{closed_port()}"
    monkeypatch.setenv("GCE_METADATA_IP", closed)
    monkeypatch.setenv("GCE_METADATA_HOST", closed)


@pytest.mark.usefixtures("no_metadata_server")
async def test_no_credentials_at_all_is_a_clear_launch_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))  # no gcloud login either
    provider = build("g", "gce", config(None))
    # on a machine that really is a GCE VM the library trusts the VM's identity, and then
    # fails fetching its token from the (closed) metadata server instead
    expected = r"^no Google Cloud credentials found \(|Google Cloud authentication failed"
    with pytest.raises(LaunchError, match=expected):
        await provider.launch(request())


# --- what is sent: names and labels -------------------------------------------------------


def test_names_and_labels_follow_gce_rules() -> None:
    assert instance_name("lch_0A1b") == "lakeshore-lch-0a1b"
    assert instance_name("x" * 80) == "lakeshore-" + "x" * 53
    assert instance_name("lch_" + "a" * 48 + "_b") == "lakeshore-lch-" + "a" * 48
    assert label_key("Team Name") == "team-name"
    assert label_key("9lives") == "k9lives"
    assert label_key("") is None
    tags = {f"tag{i}": "v" for i in range(70)}
    labels = instance_labels(GceConfig(project=PROJECT, zone=ZONE), request(cloud_tags=tags))
    assert len(labels) == 64
    assert labels["lakeshore-launch-id"] == "lch_0123abcd"  # ours are never the ones cut
    scoped = LaunchRequest("lch_1", "Team-A", "pool:GPU.big", "http://x", None, LaunchBody(()))
    ours = instance_labels(GceConfig(project=PROJECT, zone=ZONE), scoped)
    assert (ours["lakeshore-namespace"], ours["lakeshore-scope"]) == ("team-a", "pool-gpu-big")


def test_a_subnetwork_alone_names_the_interface() -> None:
    subnet = "projects/host/regions/us-central1/subnetworks/shared"
    cfg = GceConfig(project=PROJECT, zone=ZONE, image=IMAGE, subnetwork=subnet)
    [nic] = instance_spec(cfg, request())["network_interfaces"]
    assert "network" not in nic  # GCE takes the subnetwork's own network
    assert nic["subnetwork"] == subnet


def test_server_start_does_not_import_the_compute_client() -> None:
    code = (
        "import sys, lakeshore.providers as p; assert 'gce' in p.KINDS; "
        "print(sorted(m for m in sys.modules if m.startswith('google.cloud')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- the controller through the API ---------------------------------------------------


async def register(api: httpx.AsyncClient, cfg: dict[str, Any], name: str = "gcp") -> None:
    response = await api.post(f"{NS}/providers", json={"name": name, "kind": "gce", "config": cfg})
    assert response.status_code == 201, response.text


async def elastic_queue(api: httpx.AsyncClient, name: str, maximum: int) -> None:
    body = {
        "name": name,
        "elasticity": {"kind": "fully_elastic", "min": 0, "max": maximum},
        "providerRef": "gcp",
        "daemonTemplate": {"instance_type": "n2-standard-2", "cloudTags": {"team": "ml"}},
    }
    response = await api.post(f"{NS}/queues", json=body)
    assert response.status_code == 201, response.text


async def submit(api: httpx.AsyncClient, queue: str, count: int) -> list[str]:
    items = [{"fn": "tests.udfs:noop"} for _ in range(count)]
    response = await api.post(f"{NS}/queues/{queue}/invocations/batch", json={"invocations": items})
    assert response.status_code == 201, response.text
    return [item["id"] for item in response.json()["invocations"]]


async def tick(api: httpx.AsyncClient) -> dict[str, dict[str, Any]]:
    response = await api.post(TICK)
    assert response.status_code == 200, response.text
    return {d["scope"]: d for d in response.json()["decisions"]}


async def launches(api: httpx.AsyncClient) -> list[dict[str, Any]]:
    response = await api.get(f"{NS}/providers/gcp/launches")
    assert response.status_code == 200, response.text
    return list(response.json()["launches"])


def launch_token(script: str) -> str:
    """The worker token the startup script hands the daemon."""
    for line in script.splitlines():
        if line.startswith("export LAKESHORE_TOKEN="):
            return shlex.split(line)[1].split("=", 1)[1]
    raise AssertionError(f"no token in {script!r}")


async def test_the_controller_scales_up_and_down_through_gce(
    api: httpx.AsyncClient, gce: GceFake
) -> None:
    await register(api, config(gce.url))
    await elastic_queue(api, "crunch", maximum=1)
    invocations = await submit(api, "crunch", 3)

    up = (await tick(api))["crunch"]
    assert up["action"] == "scale_up", up
    name = instance_name(up["launch_id"])
    assert gce.names() == [name]
    instance = gce.instance(name)
    assert instance["machineType"] == f"zones/{ZONE}/machineTypes/n2-standard-2"
    assert instance["labels"]["lakeshore-launch-id"] == up["launch_id"]
    assert instance["labels"]["team"] == "ml"
    script = startup_script(instance)
    assert f"--launch-id {up['launch_id']}" in script and "--queue crunch" in script
    [launch] = await launches(api)
    assert launch["handle"] == {"instance": name, "project": PROJECT, "zone": ZONE}

    # the daemon on the instance says hello with the token from its startup script
    token = {"Authorization": f"Bearer {launch_token(script)}"}
    body = {"queues": ["crunch"], "launch_id": up["launch_id"]}
    hello = await api.post("/v1/workers/hello", json=body, headers=token)
    assert hello.status_code == 200, hello.text
    worker = hello.json()["id"]
    for invocation in invocations:
        cancelled = await api.post(f"{NS}/invocations/{invocation}/cancel")
        assert cancelled.status_code == 200, cancelled.text
    patch = {"elasticity": {"kind": "fully_elastic", "min": 0, "max": 0}}
    assert (await api.patch(f"{NS}/queues/crunch", json=patch)).status_code == 200

    down = (await tick(api))["crunch"]
    assert down["action"] == "scale_down", down
    assert down["victim"] == worker
    assert gce.names() == []
    [launch] = await launches(api)
    assert (launch["state"], launch["worker"]) == ("succeeded", worker)
    assert launch["terminated_at"] is not None and launch["terminate_error"] is None
    assert (await api.get(f"{NS}/queues", headers=token)).status_code == 401  # revoked


@pytest.mark.parametrize("fault", ["500", "garbage", "unreachable"])
async def test_a_failing_gce_api_is_a_noop_and_a_failed_launch(
    api: httpx.AsyncClient, gce: GceFake, fault: str, launch_tokens: list[str]
) -> None:
    endpoint = gce.url
    if fault == "500":
        gce.fail_with(500, GOOGLE_500)
    elif fault == "garbage":
        gce.fail_with(200, b"\x00\xffnot json at all")
    else:
        endpoint = f"http://127.0.0.1:{closed_port()}"
    await register(api, config(endpoint))
    await elastic_queue(api, "flaky", maximum=1)
    await submit(api, "flaky", 1)
    decision = (await tick(api))["flaky"]
    assert decision["action"] == "tick_noop"
    prefix = "target 1 > daemons 0 + in flight 0 → launch; launch failed: GCE insert of lakeshore-"
    assert decision["reason"].startswith(prefix), decision["reason"]
    expected = {
        "500": "the Compute Engine API answered 500",
        "garbage": "not a Compute Engine answer",
        "unreachable": "cannot reach the Compute Engine API",
    }[fault]
    assert expected in decision["reason"]
    launch = await assert_failed_and_released(api, "gcp", "flaky", launch_tokens)
    assert decision["reason"].endswith(launch["error"])
    assert (await tick(api))["flaky"]["before"]["in_flight"] == 0  # the slot is free again
    assert gce.names() == []


@pytest.mark.usefixtures("no_metadata_server")
async def test_missing_credentials_fail_the_launch_clearly(
    api: httpx.AsyncClient,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    launch_tokens: list[str],
) -> None:
    missing = tmp_path / "no-such-key.json"
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(missing))
    await register(api, config(None))
    await elastic_queue(api, "nocreds", maximum=1)
    await submit(api, "nocreds", 1)
    decision = (await tick(api))["nocreds"]
    assert decision["action"] == "tick_noop"
    assert decision["reason"].endswith(
        f"launch failed: no Google Cloud credentials found (File {missing} was not found.)"
    )
    await assert_failed_and_released(api, "gcp", "nocreds", launch_tokens)
    assert (await tick(api))["nocreds"]["action"] == "tick_noop"  # and the server goes on


@pytest.mark.parametrize(
    ("cfg", "field"),
    [
        ({"project": PROJECT, "zone": ZONE, "region": "us"}, "config.region"),
        ({"zone": ZONE}, "config.project"),
        ({"project": PROJECT}, "config.zone"),
        ({"project": PROJECT, "zone": "Not A Zone"}, "config.zone"),
        ({"project": PROJECT, "zone": ZONE, "api_endpoint": "127.0.0.1:80"}, "config.api_endpoint"),
        ({"project": PROJECT, "zone": ZONE, "launch_ttl_s": "300"}, "config.launch_ttl_s"),
        (
            {"project": PROJECT, "zone": ZONE, "extra_labels": {"Bad Key": "x"}},
            "config.extra_labels.Bad Key.[key]",
        ),
    ],
)
async def test_a_bad_config_is_refused_naming_the_field(
    api: httpx.AsyncClient, cfg: dict[str, Any], field: str
) -> None:
    body = {"name": "gcp", "kind": "gce", "config": cfg}
    response = await api.post(f"{NS}/providers", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == field


async def test_a_registration_stores_the_defaults(api: httpx.AsyncClient) -> None:
    await register(api, {"project": PROJECT, "zone": ZONE})
    stored = (await api.get(f"{NS}/providers/gcp")).json()
    assert stored["config"] == {
        "project": PROJECT,
        "zone": ZONE,
        "machine_type": "e2-medium",
        "external_ip": True,
        "launch_ttl_s": 300.0,
        "extra_labels": {},
    }


async def test_only_the_admin_may_register_one(api: httpx.AsyncClient) -> None:
    """It acts with the server's own credentials, like ec2 and kube."""
    headers = await namespace_token(api, "default")
    body = {"name": "gcp", "kind": "gce", "config": {"project": PROJECT, "zone": ZONE}}
    refused = await api.post(f"{NS}/providers", json=body, headers=headers)
    assert refused.status_code == 403, refused.text
    assert "only the admin token" in refused.json()["error"]["message"]


async def test_a_launch_given_up_on_deletes_its_instance(
    gce: GceFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The controller's time-out cancels the launch while the insert is still on its way;
    the instance it makes after all is deleted, not orphaned."""
    provider = build("g", "gce", config(gce.url))
    release = threading.Event()
    insert = provider._insert  # type: ignore[attr-defined]

    def slow_insert(*args: Any) -> None:
        release.wait(10)
        insert(*args)

    monkeypatch.setattr(provider, "_insert", slow_insert)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(provider.launch(request("lch_slow")), timeout=0.2)
    release.set()
    for _ in range(200):
        if any(r.method == "DELETE" for r in gce.requests) and gce.names() == []:
            break
        await asyncio.sleep(0.05)
    else:
        pytest.fail(f"the abandoned launch's instance was not deleted: {gce.names()}")
    assert [r.method for r in gce.requests] == ["POST", "DELETE"]


@pytest.fixture
async def impatient_api(settings: Settings, clock: FakeClock) -> AsyncIterator[httpx.AsyncClient]:
    """The API in-process, its controller waiting 0.5 s for a provider call."""
    app = create_app(settings.model_copy(update={"elasticity_call_timeout_s": 0.5}), clock=clock)
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://lakeshore.test", headers=ADMIN
        ) as client:
            yield client


async def test_a_hung_gce_api_fails_the_launch_and_its_late_instance_is_deleted(
    impatient_api: httpx.AsyncClient,
    gce: GceFake,
    monkeypatch: pytest.MonkeyPatch,
    launch_tokens: list[str],
) -> None:
    """The insert answers only after the controller's time-out: a tick_noop saying so, the
    launch failed with its slot free and its token revoked, and the instance made after
    all is deleted."""
    release = threading.Event()
    insert = GceProvider._insert

    def hung_insert(self: GceProvider, *args: Any) -> None:
        release.wait(10)
        insert(self, *args)

    monkeypatch.setattr(GceProvider, "_insert", hung_insert)
    api = impatient_api
    await register(api, config(gce.url))
    await elastic_queue(api, "hung", maximum=1)
    await submit(api, "hung", 1)
    try:
        decision = (await tick(api))["hung"]
    finally:
        release.set()
    assert decision["action"] == "tick_noop"
    assert decision["reason"].endswith(
        'launch failed: provider "gcp" did not answer within 0.5 s'
    ), decision["reason"]
    await assert_failed_and_released(api, "gcp", "hung", launch_tokens)
    for _ in range(200):
        if any(r.method == "DELETE" for r in gce.requests) and gce.names() == []:
            break
        await asyncio.sleep(0.05)
    else:
        pytest.fail(f"the late instance was not deleted: {gce.names()}")
