"""The ``ec2`` provider against moto's server mode on 127.0.0.1: launch, describe by our
tags, terminate, the faults (an unreachable endpoint, no credentials, API errors, garbage
answers, a caller that gives up), and the controller scaling up and down through it.

One ``moto_server`` runs for the module; every test starts from a reset moto and an AWS
environment of its own (fake keys, no shared files, no instance metadata lookups).
"""

from __future__ import annotations

import asyncio
import base64
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from asgi_lifespan import LifespanManager

from lakeshore.api.app import create_app
from lakeshore.config import Settings
from lakeshore.domain.fleet import LaunchBody
from lakeshore.providers import LaunchError, LaunchRequest, base, build, ec2
from tests.conftest import ADMIN, FakeClock
from tests.integration.launches import assert_failed_and_released
from tests.integration.test_api_workers import hello
from tests.moto_server import AMI, REGION, free_port

NS = "/v1/namespaces/default"
TICK = "/v1/admin/elasticity/tick"
GONE = ("shutting-down", "terminated")


@pytest.fixture(autouse=True)
def aws_env(moto_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Fake keys and nothing else from this machine's AWS setup; moto emptied."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    httpx.post(f"{moto_url}/moto-api/reset", timeout=10).raise_for_status()


@pytest.fixture
def aws(moto_url: str) -> Any:
    """An EC2 client of the test's own, to look at what the provider did."""
    return boto3.client("ec2", region_name=REGION, endpoint_url=moto_url)


def request(launch_id: str = "lch_test1", **body: Any) -> LaunchRequest:
    return LaunchRequest(
        launch_id=launch_id,
        namespace="default",
        scope="jobs",
        server_url="http://lakeshore.test:8000",
        token="lks-worker-secret",
        body=LaunchBody(queues=("jobs",), **body),
    )


def provider(moto_url: str, **config: Any) -> ec2.Ec2Provider:
    built = build("aws", "ec2", {"region": REGION, "endpoint_url": moto_url, **config})
    assert isinstance(built, ec2.Ec2Provider)
    return built


def instances(aws: Any, **filters: str) -> list[dict[str, Any]]:
    wanted = [{"Name": f"tag:{key}", "Values": [value]} for key, value in filters.items()]
    answer = aws.describe_instances(Filters=wanted) if wanted else aws.describe_instances()
    return [i for reservation in answer["Reservations"] for i in reservation["Instances"]]


def state(aws: Any, instance_id: str) -> str:
    [found] = instances_by_id(aws, instance_id)
    return str(found["State"]["Name"])


def instances_by_id(aws: Any, instance_id: str) -> list[dict[str, Any]]:
    answer = aws.describe_instances(InstanceIds=[instance_id])
    return [i for reservation in answer["Reservations"] for i in reservation["Instances"]]


def user_data(aws: Any, instance_id: str) -> str:
    answer = aws.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
    return base64.b64decode(answer["UserData"]["Value"]).decode()


def tags_of(instance: dict[str, Any]) -> dict[str, str]:
    return {tag["Key"]: tag["Value"] for tag in instance.get("Tags", [])}


# --- the provider on its own --------------------------------------------------------------


async def test_a_launch_runs_one_instance_tagged_and_with_its_user_data(
    moto_url: str, aws: Any
) -> None:
    ec2_provider = provider(moto_url, extra_tags={"cost-center": "42", "team": "overridden"})
    launch = request(
        instance_type="t3.small",
        image_id=AMI,
        cloud_tags={"team": "ml", "odd": "a*b\nc"},
        bootstrap_script="echo boot",
        setup_commands=("echo one", "echo two"),
    )
    handle = await ec2_provider.launch(launch)
    assert handle == {"instance_id": handle["instance_id"], "region": REGION}
    [instance] = instances(aws, **{"lakeshore-launch-id": "lch_test1"})
    assert instance["InstanceId"] == handle["instance_id"]
    assert (instance["InstanceType"], instance["ImageId"]) == ("t3.small", AMI)
    assert tags_of(instance) == {
        "Name": "lakeshore-jobs-lch_test1",
        "cost-center": "42",
        "team": "ml",  # the template's cloudTags win over the config's extra_tags
        "odd": "a_b_c",  # made valid for every AWS service
        "lakeshore-launch-id": "lch_test1",
        "lakeshore-namespace": "default",
        "lakeshore-scope": "jobs",
    }
    script = user_data(aws, handle["instance_id"])
    assert script == launch.startup_script(base.default_install_command())
    assert script.index("echo boot") < script.index("echo one") < script.index("pip install")
    assert "export LAKESHORE_TOKEN=lks-worker-secret" in script
    assert "--launch-id lch_test1" in script


async def test_config_defaults_and_network_options_are_used(moto_url: str, aws: Any) -> None:
    vpc = aws.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = aws.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24")["Subnet"]["SubnetId"]
    group = aws.create_security_group(GroupName="workers", Description="w", VpcId=vpc)["GroupId"]
    aws.create_key_pair(KeyName="ops")
    iam = boto3.client("iam", region_name=REGION, endpoint_url=moto_url)
    profile = iam.create_instance_profile(InstanceProfileName="lakeshore-worker")
    ec2_provider = provider(
        moto_url,
        instance_type="m5.large",
        image_id=AMI,
        subnet_id=subnet,
        security_group_ids=[group],
        key_name="ops",
        instance_profile=profile["InstanceProfile"]["Arn"],
        install_command="pip install lakeshore-from-my-mirror",
    )
    handle = await ec2_provider.launch(request())  # the template names no type or image
    [instance] = instances_by_id(aws, handle["instance_id"])
    assert (instance["InstanceType"], instance["ImageId"]) == ("m5.large", AMI)
    assert instance["SubnetId"] == subnet
    assert [g["GroupId"] for g in instance["SecurityGroups"]] == [group]
    assert instance["KeyName"] == "ops"
    assert instance["IamInstanceProfile"]["Arn"] == profile["InstanceProfile"]["Arn"]
    assert "pip install lakeshore-from-my-mirror\n" in user_data(aws, handle["instance_id"])


async def test_no_image_or_type_anywhere_is_a_clear_launch_error(moto_url: str, aws: Any) -> None:
    with pytest.raises(LaunchError) as no_image:
        await provider(moto_url, instance_type="t3.micro").launch(request())
    assert str(no_image.value) == (
        "no image_id for the EC2 instance: set daemonTemplate.image_id on the queue, "
        'or a default in provider "aws"\'s config'
    )
    with pytest.raises(LaunchError) as neither:
        await provider(moto_url).launch(request())
    assert str(neither.value).startswith(
        "no image_id and no instance_type for the EC2 instance: "
        "set daemonTemplate.image_id and daemonTemplate.instance_type on the queue"
    )
    assert instances(aws) == []


async def test_ec2_refusals_and_bad_templates_are_launch_errors(moto_url: str, aws: Any) -> None:
    refused = provider(moto_url, image_id=AMI, instance_type="t3.micro", subnet_id="subnet-0bad")
    with pytest.raises(LaunchError, match=r"EC2 RunInstances refused: InvalidSubnetID.NotFound"):
        await refused.launch(request())
    fine = provider(moto_url, image_id=AMI, instance_type="t3.micro")
    with pytest.raises(LaunchError, match=r'tag key "aws:owner" is reserved'):
        await fine.launch(request(cloud_tags={"aws:owner": "me"}))
    too_many = {f"k{i}": "v" for i in range(60)}
    with pytest.raises(LaunchError, match="64 tags and EC2 takes at most 50"):
        await fine.launch(request(cloud_tags=too_many))
    with pytest.raises(LaunchError, match=r"user-data is \d+ bytes and EC2 takes at most 16384"):
        await fine.launch(request(bootstrap_script="x" * 20_000))
    unknown_profile = provider(moto_url, image_id=AMI, instance_type="t3.micro", profile="nope")
    with pytest.raises(LaunchError, match=r"^AWS credentials are not usable: .*profile \(nope\)"):
        await unknown_profile.launch(request())
    assert instances(aws) == []


async def test_terminate_stops_the_instance_and_a_gone_one_is_fine(moto_url: str, aws: Any) -> None:
    ec2_provider = provider(moto_url, image_id=AMI, instance_type="t3.micro")
    handle = await ec2_provider.launch(request())
    assert state(aws, handle["instance_id"]) in ("pending", "running")
    await ec2_provider.terminate(handle, "wrk_1")
    assert state(aws, handle["instance_id"]) in GONE
    await ec2_provider.terminate(handle, "wrk_1")  # already terminated
    await ec2_provider.terminate({"instance_id": "i-0123456789abcdef0", "region": REGION}, "w")
    with pytest.raises(LaunchError, match="names no EC2 instance"):
        await ec2_provider.terminate({"pid": 12}, "wrk_1")


async def test_a_launch_given_up_on_terminates_its_instance(
    moto_url: str, aws: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The controller's time-out cancels the launch while RunInstances is still on its
    way; the instance it makes after all is terminated, not orphaned."""
    release = threading.Event()
    make_client = ec2._make_client

    class SlowClient:
        def __init__(self, real: Any) -> None:
            self.real = real

        def run_instances(self, **params: Any) -> Any:
            release.wait(10)
            return self.real.run_instances(**params)

        def terminate_instances(self, **params: Any) -> Any:
            return self.real.terminate_instances(**params)

    monkeypatch.setattr(ec2, "_make_client", lambda c, r: SlowClient(make_client(c, r)))
    ec2_provider = provider(moto_url, image_id=AMI, instance_type="t3.micro")
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(ec2_provider.launch(request("lch_slow")), timeout=0.2)
    release.set()
    for _ in range(200):
        found = instances(aws, **{"lakeshore-launch-id": "lch_slow"})
        if found and found[0]["State"]["Name"] in GONE:
            break
        await asyncio.sleep(0.05)
    else:
        pytest.fail(f"the abandoned launch's instance was not terminated: {found}")


# --- the controller through the API, on both stores ------------------------------------


async def register(api: httpx.AsyncClient, name: str = "aws", **config: Any) -> None:
    body = {"name": name, "kind": "ec2", "config": {"region": REGION, **config}}
    response = await api.post(f"{NS}/providers", json=body)
    assert response.status_code == 201, response.text


async def elastic_queue(api: httpx.AsyncClient, name: str, provider_name: str = "aws") -> None:
    body = {
        "name": name,
        "elasticity": {"kind": "fully_elastic", "min": 0, "max": 1},
        "providerRef": provider_name,
        "daemonTemplate": {"instance_type": "t3.micro", "cloudTags": {"team": "ml"}},
    }
    response = await api.post(f"{NS}/queues", json=body)
    assert response.status_code == 201, response.text


async def submit(api: httpx.AsyncClient, queue: str) -> str:
    response = await api.post(f"{NS}/queues/{queue}/invocations", json={"fn": "tests.udfs:noop"})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


async def tick(api: httpx.AsyncClient, scope: str) -> dict[str, Any]:
    response = await api.post(TICK)
    assert response.status_code == 200, response.text
    [decision] = [d for d in response.json()["decisions"] if d["scope"] == scope]
    return dict(decision)


async def launches(api: httpx.AsyncClient, name: str = "aws") -> list[dict[str, Any]]:
    response = await api.get(f"{NS}/providers/{name}/launches")
    assert response.status_code == 200, response.text
    return list(response.json()["launches"])


async def test_the_controller_scales_up_and_down_through_ec2(
    api: httpx.AsyncClient, moto_url: str, aws: Any
) -> None:
    await register(api, endpoint_url=moto_url, image_id=AMI)
    stored = (await api.get(f"{NS}/providers/aws")).json()["config"]
    assert stored["launch_ttl_s"] == 300 and "install_command" not in stored
    await elastic_queue(api, "jobs")
    invocation = await submit(api, "jobs")
    up = await tick(api, "jobs")
    assert up["action"] == "scale_up", up
    [launch] = await launches(api)
    assert launch["id"] == up["launch_id"] and launch["state"] == "in_flight"
    instance_id = launch["handle"]["instance_id"]
    assert launch["handle"] == {"instance_id": instance_id, "region": REGION}
    [instance] = instances(aws, **{"lakeshore-launch-id": launch["id"]})
    assert instance["InstanceId"] == instance_id and instance["InstanceType"] == "t3.micro"
    assert tags_of(instance)["team"] == "ml"
    assert f"--launch-id {launch['id']}" in user_data(aws, instance_id)
    # the daemon on that instance says hello; its work goes away, and the queue shrinks
    worker = await hello(api, ["jobs"], launch_id=launch["id"])
    cancelled = await api.post(f"{NS}/invocations/{invocation}/cancel")
    assert cancelled.status_code == 200, cancelled.text
    patched = await api.patch(
        f"{NS}/queues/jobs", json={"elasticity": {"kind": "fully_elastic", "min": 0, "max": 0}}
    )
    assert patched.status_code == 200, patched.text
    down = await tick(api, "jobs")
    assert down["action"] == "scale_down", down
    assert down["victim"] == worker
    assert state(aws, instance_id) in GONE
    [after] = await launches(api)
    assert after["terminated_at"] is not None and after["terminate_error"] is None


async def test_an_unreachable_endpoint_fails_the_launch_and_frees_the_slot(
    api: httpx.AsyncClient, launch_tokens: list[str]
) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    await register(api, endpoint_url=closed, image_id=AMI)
    await elastic_queue(api, "jobs")
    await submit(api, "jobs")
    decision = await tick(api, "jobs")
    assert decision["action"] == "tick_noop"
    assert f"launch failed: cannot reach {closed}: Could not connect" in decision["reason"]
    launch = await assert_failed_and_released(api, "aws", "jobs", launch_tokens)
    assert launch["error"].startswith(f"launch failed: cannot reach {closed}")
    assert (await tick(api, "jobs"))["before"]["in_flight"] == 0


async def test_missing_credentials_are_a_clear_launch_failure(
    api: httpx.AsyncClient,
    moto_url: str,
    aws: Any,
    monkeypatch: pytest.MonkeyPatch,
    launch_tokens: list[str],
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    await register(api, endpoint_url=moto_url, image_id=AMI)
    await elastic_queue(api, "jobs")
    await submit(api, "jobs")
    decision = await tick(api, "jobs")
    assert decision["action"] == "tick_noop"
    assert "launch failed: no AWS credentials found (set AWS_ACCESS_KEY_ID" in decision["reason"]
    await assert_failed_and_released(api, "aws", "jobs", launch_tokens)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    assert instances(aws) == []


async def test_a_garbage_answer_fails_the_launch(
    api: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch, launch_tokens: list[str]
) -> None:
    class Garbage:
        def run_instances(self, **params: Any) -> Any:
            return {"Instances": [], "ReservationId": "r-1"}

    monkeypatch.setattr(ec2, "_make_client", lambda config, region: Garbage())
    await register(api, image_id=AMI)
    await elastic_queue(api, "jobs")
    await submit(api, "jobs")
    decision = await tick(api, "jobs")
    assert decision["action"] == "tick_noop"
    assert decision["reason"].endswith(
        "launch failed: EC2 answered RunInstances without any instance"
    )
    launch = await assert_failed_and_released(api, "aws", "jobs", launch_tokens)
    assert launch["error"] == "launch failed: EC2 answered RunInstances without any instance"


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


async def test_a_hung_ec2_api_fails_the_launch_and_its_late_instance_is_terminated(
    impatient_api: httpx.AsyncClient,
    moto_url: str,
    aws: Any,
    monkeypatch: pytest.MonkeyPatch,
    launch_tokens: list[str],
) -> None:
    """RunInstances answers only after the controller's time-out: the decision is a
    tick_noop saying so, the launch failed with its slot free and its token revoked, and
    the instance made after all is terminated."""
    release = threading.Event()
    make_client = ec2._make_client

    class HungClient:
        def __init__(self, real: Any) -> None:
            self.real = real

        def run_instances(self, **params: Any) -> Any:
            release.wait(10)
            return self.real.run_instances(**params)

        def terminate_instances(self, **params: Any) -> Any:
            return self.real.terminate_instances(**params)

    monkeypatch.setattr(ec2, "_make_client", lambda c, r: HungClient(make_client(c, r)))
    api = impatient_api
    await register(api, endpoint_url=moto_url, image_id=AMI)
    await elastic_queue(api, "jobs")
    await submit(api, "jobs")
    try:
        decision = await tick(api, "jobs")
    finally:
        release.set()
    assert decision["action"] == "tick_noop"
    assert decision["reason"].endswith(
        'launch failed: provider "aws" did not answer within 0.5 s'
    ), decision["reason"]
    launch = await assert_failed_and_released(api, "aws", "jobs", launch_tokens)
    for _ in range(200):
        found = instances(aws, **{"lakeshore-launch-id": launch["id"]})
        if found and all(i["State"]["Name"] in GONE for i in found):
            break
        await asyncio.sleep(0.05)
    else:
        pytest.fail(f"the late instance was not terminated: {found}")


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"region": REGION, "zone": "a"}, "config.zone"),
        ({}, "config.region"),
        ({"region": REGION, "security_group_ids": "sg-0123abcd"}, "config.security_group_ids"),
        ({"region": REGION, "subnet_id": "vpc-0123"}, "config.subnet_id"),
        ({"region": REGION, "launch_ttl_s": "300"}, "config.launch_ttl_s"),
        ({"region": REGION, "endpoint_url": "ftp://x"}, "config.endpoint_url"),
        ({"region": REGION, "extra_tags": {"aws:x": "y"}}, "config.extra_tags.aws:x.[key]"),
    ],
)
async def test_a_bad_config_is_refused_at_registration(
    api: httpx.AsyncClient, config: dict[str, Any], field: str
) -> None:
    body = {"name": "aws", "kind": "ec2", "config": config}
    response = await api.post(f"{NS}/providers", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == field
