"""The ``kube`` provider against an in-memory Kubernetes API served over real HTTP on
127.0.0.1 (kmock's ``KubernetesEmulator`` + ``Server``), which the official client talks to.

The emulator ignores label selectors, so these tests list Pods and Secrets and filter by
label themselves. Covered: a launch straight through the provider (Pod, Secret, labels,
image, command, environment), terminate (and terminate of what is already gone), the API's
errors, garbage and slowness, and the controller scaling up and down through it over the
API on both stores; unreachable servers, missing kubeconfigs and bad config keys.
"""

from __future__ import annotations

import asyncio
import base64
import os
import re
import socket
import subprocess
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import kmock
import pytest

from lakeshore.domain.fleet import LaunchBody
from lakeshore.providers import LaunchError, LaunchRequest
from lakeshore.providers.kube import KubeConfig, KubeProvider
from lakeshore.providers.kube_manifests import LABEL_VALUE_RE, object_name
from tests.conftest import FakeClock
from tests.integration.launches import assert_failed_and_released
from tests.integration.test_api_workers import hello
from tests.integration.test_controller import NS, elastic, queue, submit_many, tick

IMAGE = "ghcr.io/acme/lakeshore:1.0"
LAUNCH_ID = "lch_0123456789abcdef0123"
TOKEN = "lks-worker-token-for-this-launch"


@dataclass
class Cluster:
    """The emulator and its URL; ``objects`` lists one kind and filters by label here."""

    emulator: kmock.KubernetesEmulator
    url: str

    async def objects(
        self, plural: str, labels: dict[str, str] | None = None, namespace: str = "default"
    ) -> list[dict[str, Any]]:
        async with self.emulator.get(f"/api/v1/namespaces/{namespace}/{plural}") as response:
            assert response.status == 200, await response.text()
            items: list[dict[str, Any]] = (await response.json())["items"]
        wanted = labels or {}
        return [
            item
            for item in items
            if all(item["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())
        ]

    async def pods(self, launch_id: str, namespace: str = "default") -> list[dict[str, Any]]:
        return await self.objects("pods", {"lakeshore-launch-id": launch_id}, namespace)

    async def secrets(self, launch_id: str, namespace: str = "default") -> list[dict[str, Any]]:
        return await self.objects("secrets", {"lakeshore-launch-id": launch_id}, namespace)


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    async with kmock.KubernetesEmulator() as emulator, kmock.Server(emulator) as server:
        for plural in ("pods", "secrets"):  # listable before the first object exists
            emulator.resources[f"v1/{plural}"] = kmock.ResourceInfo(namespaced=True)
        yield Cluster(emulator, str(server.url).rstrip("/"))


def closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def launch_request(
    launch_id: str = LAUNCH_ID,
    scope: str = "work",
    token: str | None = TOKEN,
    **body: Any,
) -> LaunchRequest:
    return LaunchRequest(
        launch_id,
        "default",
        scope,
        "http://lakeshore.test",
        token,
        LaunchBody(queues=("work",), **body),
    )


def kube(cluster: Cluster, **config: Any) -> KubeProvider:
    return KubeProvider("k8s", KubeConfig.model_validate({"host": cluster.url, **config}))


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    [container] = pod["spec"]["containers"]
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container["env"]}


def token_of(secret: dict[str, Any]) -> str:
    if "stringData" in secret:  # the emulator keeps what was sent; a real API encodes it
        return str(secret["stringData"]["token"])
    return base64.b64decode(secret["data"]["token"]).decode()


# --- the provider on its own ----------------------------------------------------------------


async def test_a_launch_creates_a_labelled_pod_and_a_token_secret(cluster: Cluster) -> None:
    provider = kube(cluster, image=IMAGE)
    pooled = launch_request(scope="pool:gpu", cloud_tags={"team": "a b'c"})
    other = launch_request(launch_id="lch_ffffffffffffffffffff")
    handle = await provider.launch(pooled)
    await provider.launch(other)
    name = object_name(LAUNCH_ID)
    assert name == "lakeshore-lch-0123456789abcdef0123"
    assert handle == {"pod": name, "namespace": "default", "secret": name}
    assert len(await cluster.objects("pods")) == 2  # the emulator ignores selectors

    [pod] = await cluster.pods(LAUNCH_ID)
    meta = pod["metadata"]
    assert meta["name"] == name
    assert meta["labels"]["lakeshore-namespace"] == "default"
    scope_label = meta["labels"]["lakeshore-scope"]
    assert scope_label != "pool:gpu" and LABEL_VALUE_RE.fullmatch(scope_label)
    assert meta["annotations"]["lakeshore-scope"] == "pool:gpu"  # the exact scope
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False
    [container] = spec["containers"]
    assert container["image"] == IMAGE
    assert container["command"] == ["lakeshore"]
    assert container["args"] == pooled.daemon_args()
    assert "--tag" in container["args"] and "team:a b'c" in container["args"]
    assert env_of(pod) == {
        "LAKESHORE_URL": "http://lakeshore.test",
        "LAKESHORE_NAMESPACE": "default",
        "LAKESHORE_TOKEN": {"secretKeyRef": {"name": name, "key": "token"}},
    }
    [secret] = await cluster.secrets(LAUNCH_ID)
    assert secret["metadata"]["name"] == name
    assert token_of(secret) == TOKEN
    assert len(await cluster.pods("lch_ffffffffffffffffffff")) == 1


async def test_the_template_image_setup_and_the_config_shape_the_pod(cluster: Cluster) -> None:
    provider = kube(
        cluster,
        namespace="batch",
        image=IMAGE,
        image_pull_policy="IfNotPresent",
        service_account="lakeshore-daemon",
        resources={"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": 2}},
        extra_labels={"team": "ml", "lakeshore-scope": "not-ours-to-set"},
    )
    request = launch_request(
        token=None,
        image_id="registry.local/custom:2",
        bootstrap_script="echo boot",
        setup_commands=("echo one", "echo two"),
    )
    handle = await provider.launch(request)
    assert handle == {"pod": object_name(LAUNCH_ID), "namespace": "batch", "secret": None}
    [pod] = await cluster.pods(LAUNCH_ID, namespace="batch")
    assert await cluster.secrets(LAUNCH_ID, namespace="batch") == []  # no token, no secret
    assert pod["metadata"]["labels"]["team"] == "ml"
    assert pod["metadata"]["labels"]["lakeshore-scope"] == "work"  # ours win
    spec = pod["spec"]
    assert spec["serviceAccountName"] == "lakeshore-daemon"
    assert "automountServiceAccountToken" not in spec
    [container] = spec["containers"]
    assert container["image"] == "registry.local/custom:2"
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert container["resources"] == {
        "requests": {"cpu": "500m", "memory": "1Gi"},
        "limits": {"cpu": "2"},
    }
    assert container["command"][:2] == ["/bin/sh", "-c"]
    assert container["command"][3] == "lakeshore"
    assert container["args"] == request.daemon_args()
    assert "LAKESHORE_TOKEN" not in env_of(pod)


def test_the_pod_command_runs_bootstrap_then_setup_then_execs_the_daemon(tmp_path: Path) -> None:
    """The container's command, run here by /bin/sh with a stand-in ``lakeshore``."""
    from lakeshore.providers.kube_manifests import pod_manifest

    log = tmp_path / "log"
    fake = tmp_path / "bin" / "lakeshore"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\nprintf 'daemon %s\\n' \"$@\" >> {log}\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}"}

    def run(*setup: str) -> subprocess.CompletedProcess[str]:
        log.unlink(missing_ok=True)
        request = launch_request(
            cloud_tags={"team": "a b'c"},
            bootstrap_script=f"echo boot >> {log}",
            setup_commands=setup,
        )
        container = pod_manifest("p", KubeConfig(), request, IMAGE, None)["spec"]["containers"][0]
        argv = [*container["command"], *container["args"]]
        return subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True)

    assert run(f"echo one >> {log}", f"echo two >> {log}").returncode == 0
    args = launch_request(cloud_tags={"team": "a b'c"}).daemon_args()
    assert log.read_text().splitlines() == ["boot", "one", "two", *(f"daemon {a}" for a in args)]
    failed = run(f"echo one >> {log}", "false", f"echo never >> {log}")
    assert failed.returncode != 0
    assert log.read_text().splitlines() == ["boot", "one"]  # the daemon never started


async def test_a_launch_without_any_image_fails_clearly(cluster: Cluster) -> None:
    with pytest.raises(LaunchError, match=r"no image to run: set daemonTemplate\.image_id"):
        await kube(cluster).launch(launch_request())
    assert await cluster.objects("secrets") == []


async def test_terminate_deletes_the_pod_and_the_secret(cluster: Cluster) -> None:
    provider = kube(cluster, image=IMAGE)
    handle = await provider.launch(launch_request())
    await provider.launch(launch_request(launch_id="lch_keepme"))
    await provider.terminate(handle, "wrk_1")
    assert await cluster.pods(LAUNCH_ID) == []
    assert await cluster.secrets(LAUNCH_ID) == []
    assert len(await cluster.pods("lch_keepme")) == 1  # only its own
    await provider.terminate(handle, "wrk_1")  # already gone: fine
    never = {"pod": "lakeshore-lch-never", "namespace": "default", "secret": "lakeshore-x"}
    await provider.terminate(never, "wrk_2")


@pytest.mark.parametrize(
    "handle",
    [{}, {"pod": "p"}, {"pod": "Bad Name", "namespace": "default"}, {"fake": "lch_1"}],
)
async def test_terminate_refuses_a_handle_it_did_not_make(
    cluster: Cluster, handle: dict[str, Any]
) -> None:
    with pytest.raises(LaunchError, match="not a kube launch handle"):
        await kube(cluster).terminate(handle, "wrk_1")


async def test_an_api_error_fails_the_launch_and_leaves_no_secret(cluster: Cluster) -> None:
    refusal = {"kind": "Status", "code": 403, "message": "pods is forbidden: exceeded quota"}
    cluster.emulator["post /api/v1/namespaces/default/pods"] << 403 << refusal
    with pytest.raises(LaunchError) as failure:
        await kube(cluster, image=IMAGE).launch(launch_request())
    assert str(failure.value) == (
        f"creating pod {object_name(LAUNCH_ID)} in namespace default: Kubernetes API "
        "answered 403 Forbidden: pods is forbidden: exceeded quota"
    )
    assert await cluster.secrets(LAUNCH_ID) == []
    assert await cluster.pods(LAUNCH_ID) == []


async def test_a_garbage_answer_fails_the_launch(cluster: Cluster) -> None:
    cluster.emulator["post /api/v1/namespaces/default/pods"] << b"<html>proxy says hi</html>"
    with pytest.raises(LaunchError, match="answered with something that is not that pod"):
        await kube(cluster, image=IMAGE).launch(launch_request())
    assert await cluster.secrets(LAUNCH_ID) == []


async def test_a_slow_api_times_out_into_a_launch_error(cluster: Cluster) -> None:
    async def slow() -> dict[str, Any]:
        await asyncio.sleep(1)
        return {}

    cluster.emulator["post /api/v1/namespaces/default/secrets"] << slow
    provider = kube(cluster, image=IMAGE, request_timeout_s=0.2)
    expected = f"cannot reach the Kubernetes API at {cluster.url}: timed out"
    with pytest.raises(LaunchError, match=re.escape(expected)):
        await provider.launch(launch_request())


async def test_an_unreachable_api_is_a_clear_launch_error() -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    provider = KubeProvider("k8s", KubeConfig(host=url, image=IMAGE))
    expected = f"cannot reach the Kubernetes API at {url}: connection refused"
    with pytest.raises(LaunchError, match=re.escape(expected)):
        await provider.launch(launch_request())
    with pytest.raises(LaunchError, match="deleting pod"):
        await provider.terminate({"pod": "p", "namespace": "default", "secret": None}, "w")


# --- through the controller, over the API ----------------------------------------------------


async def register(api: httpx.AsyncClient, name: str = "k8s", **config: Any) -> None:
    body = {"name": name, "kind": "kube", "config": config}
    response = await api.post(f"{NS}/providers", json=body)
    assert response.status_code == 201, response.text


async def launches(api: httpx.AsyncClient, name: str = "k8s") -> list[dict[str, Any]]:
    response = await api.get(f"{NS}/providers/{name}/launches")
    assert response.status_code == 200, response.text
    return list(response.json()["launches"])


async def test_the_controller_scales_up_and_down_through_kube(
    api: httpx.AsyncClient, clock: FakeClock, cluster: Cluster
) -> None:
    await register(api, host=cluster.url, image=IMAGE)
    await queue(api, "kq", elastic(max=1), providerRef="k8s")
    submitted = await api.post(f"{NS}/queues/kq/invocations", json={"fn": "tests.udfs:noop"})
    assert submitted.status_code == 201, submitted.text
    up = (await tick(api))["kq"]
    assert up["action"] == "scale_up", up["reason"]
    [launch] = await launches(api)
    assert launch["id"] == up["launch_id"]
    name = object_name(launch["id"])
    assert launch["handle"] == {"pod": name, "namespace": "default", "secret": name}
    [pod] = await cluster.pods(launch["id"])
    assert pod["metadata"]["name"] == name
    args = pod["spec"]["containers"][0]["args"]
    assert args[:4] == ["daemon", "run", "--launch-id", launch["id"]]
    assert len(await cluster.secrets(launch["id"])) == 1

    worker = await hello(api, ["kq"], launch_id=launch["id"])
    invocation = submitted.json()["id"]
    cancelled = await api.post(f"{NS}/invocations/{invocation}/cancel")
    assert cancelled.status_code == 200, cancelled.text
    patched = await api.patch(f"{NS}/queues/kq", json={"elasticity": elastic(max=0)})
    assert patched.status_code == 200, patched.text
    clock.advance(1)
    down = (await tick(api))["kq"]
    assert down["action"] == "scale_down", down["reason"]
    assert down["victim"] == worker
    assert await cluster.pods(launch["id"]) == []
    assert await cluster.secrets(launch["id"]) == []
    [after] = await launches(api)
    assert after["terminated_at"] is not None and after["terminate_error"] is None


async def test_an_unreachable_api_is_a_noop_and_a_failed_launch(
    api: httpx.AsyncClient, launch_tokens: list[str]
) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    await register(api, host=url, image=IMAGE)
    await queue(api, "far", elastic(max=1), providerRef="k8s")
    await submit_many(api, "far", 1)
    decision = (await tick(api))["far"]
    assert decision["action"] == "tick_noop"
    assert "launch failed: creating secret" in decision["reason"]
    assert f"cannot reach the Kubernetes API at {url}: connection refused" in decision["reason"]
    launch = await assert_failed_and_released(api, "k8s", "far", launch_tokens)
    assert launch["error"].startswith("launch failed: ")
    again = (await tick(api))["far"]
    assert again["before"]["in_flight"] == 0  # the slot is free again


@pytest.mark.parametrize("fault", ["403", "garbage", "slow"])
async def test_a_failing_api_is_a_noop_a_failed_launch_and_a_revoked_token(
    api: httpx.AsyncClient, cluster: Cluster, launch_tokens: list[str], fault: str
) -> None:
    """The API refuses the pod, answers with something that is not one, or does not answer
    within ``request_timeout_s``: a tick_noop with the reason, the launch failed, its
    slot free, its token revoked and no Secret left behind."""
    route = "post /api/v1/namespaces/default/pods"
    if fault == "403":
        refusal = {"kind": "Status", "code": 403, "message": "pods is forbidden: exceeded quota"}
        cluster.emulator[route] << 403 << refusal
    elif fault == "garbage":
        cluster.emulator[route] << b"<html>proxy says hi</html>"
    else:

        async def slow() -> dict[str, Any]:
            await asyncio.sleep(1)
            return {}

        cluster.emulator[route] << slow
    await register(api, host=cluster.url, image=IMAGE, request_timeout_s=0.2)
    await queue(api, "kf", elastic(max=1), providerRef="k8s")
    await submit_many(api, "kf", 1)
    decision = (await tick(api))["kf"]
    assert decision["action"] == "tick_noop", decision
    expected = {
        "403": "Kubernetes API answered 403 Forbidden: pods is forbidden: exceeded quota",
        "garbage": "answered with something that is not that pod",
        "slow": f"cannot reach the Kubernetes API at {cluster.url}: timed out",
    }[fault]
    assert expected in decision["reason"], decision["reason"]
    launch = await assert_failed_and_released(api, "k8s", "kf", launch_tokens)
    assert decision["reason"].endswith(launch["error"])
    assert await cluster.secrets(launch["id"]) == []
    assert await cluster.pods(launch["id"]) == []


@pytest.mark.parametrize(
    ("contents", "message"),
    [
        (None, "launch failed: no kubeconfig at "),
        ("not: [a kubeconfig", "not a valid kubeconfig (ParserError)"),
        ("apiVersion: v1\nkind: Config\n", "Expected key current-context"),
    ],
)
async def test_a_missing_or_broken_kubeconfig_is_a_clear_launch_failure(
    api: httpx.AsyncClient,
    tmp_path: Path,
    contents: str | None,
    message: str,
    launch_tokens: list[str],
) -> None:
    path = tmp_path / "kubeconfig.yaml"
    if contents is not None:
        path.write_text(contents)
    await register(api, kubeconfig=str(path), image=IMAGE)
    await queue(api, "kc", elastic(max=1), providerRef="k8s")
    await submit_many(api, "kc", 1)
    decision = (await tick(api))["kc"]
    assert decision["action"] == "tick_noop"
    assert message in decision["reason"]
    assert str(path) in decision["reason"]
    await assert_failed_and_released(api, "k8s", "kc", launch_tokens)
    assert (await tick(api))["kc"]["action"] == "tick_noop"  # and the server carries on


async def test_in_cluster_outside_a_cluster_is_a_clear_launch_failure(
    api: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    await register(api, in_cluster=True, image=IMAGE)
    await queue(api, "ic", elastic(max=1), providerRef="k8s")
    await submit_many(api, "ic", 1)
    decision = (await tick(api))["ic"]
    assert decision["action"] == "tick_noop"
    assert "in_cluster is set but no in-cluster Kubernetes config was found" in decision["reason"]


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"host": "http://127.0.0.1:1", "imgae": IMAGE}, "config.imgae"),
        ({"host": "ftp://127.0.0.1"}, "config.host"),
        ({"host": "http://127.0.0.1:1", "in_cluster": True}, "config"),
        ({"in_cluster": True, "context": "prod"}, "config"),
        ({"namespace": "Not_A_Namespace"}, "config.namespace"),
        ({"resources": {"limits": {"cpu": "lots"}}}, "config.resources"),
        ({"extra_labels": {"team": "no spaces"}}, "config.extra_labels"),
        ({"image_pull_policy": "Sometimes"}, "config.image_pull_policy"),
        ({"launch_ttl_s": 0}, "config.launch_ttl_s"),
    ],
)
async def test_a_bad_config_is_refused_at_registration(
    api: httpx.AsyncClient, config: dict[str, Any], field: str
) -> None:
    body = {"name": "k8s", "kind": "kube", "config": config}
    response = await api.post(f"{NS}/providers", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"].startswith(field)


def test_capacity_and_instance_type_shape_the_pods_placement() -> None:
    """One CPU requested per invocation the daemon runs at once, unless the config says;
    the template's instance type selects nodes by the well-known label."""
    from lakeshore.providers.kube_manifests import INSTANCE_TYPE_LABEL, pod_manifest

    request = launch_request(capacity=3, instance_type="m5.xlarge")
    pod = pod_manifest("p", KubeConfig(), request, IMAGE, None)
    assert pod["spec"]["containers"][0]["resources"] == {"requests": {"cpu": "3"}}
    assert pod["spec"]["nodeSelector"] == {INSTANCE_TYPE_LABEL: "m5.xlarge"}
    sized = KubeConfig.model_validate({"resources": {"requests": {"cpu": "500m"}}})
    plain = pod_manifest("p", sized, launch_request(), IMAGE, None)
    assert plain["spec"]["containers"][0]["resources"] == {"requests": {"cpu": "500m"}}
    assert "nodeSelector" not in plain["spec"]


async def test_a_launch_given_up_on_deletes_its_pod_and_secret(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The controller's time-out cancels the launch while the pod is still being made;
    what the call makes after all is deleted, not orphaned."""
    provider = kube(cluster, image=IMAGE)
    release = threading.Event()
    call = provider._call

    def slow_call(what: str, method: str, *args: Any, **kwargs: Any) -> Any:
        if method == "create_namespaced_pod":
            release.wait(10)
        return call(what, method, *args, **kwargs)

    monkeypatch.setattr(provider, "_call", slow_call)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(provider.launch(launch_request()), timeout=0.2)
    for _ in range(200):  # the secret is made first; the pod waits for the release
        if await cluster.secrets(LAUNCH_ID):
            break
        await asyncio.sleep(0.05)
    else:
        pytest.fail("the launch never made its secret")
    release.set()
    for _ in range(200):
        if not await cluster.pods(LAUNCH_ID) and not await cluster.secrets(LAUNCH_ID):
            break
        await asyncio.sleep(0.05)
    else:
        pytest.fail("the abandoned launch's pod or secret was left behind")
