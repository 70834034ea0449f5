"""The ``kube`` provider's config and the objects it creates: validation of names, labels
and quantities as Kubernetes checks them, and the Secret and Pod manifests of a launch."""

from __future__ import annotations

import hashlib
import re
from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from lakeshore.providers import base

DEFAULT_LAUNCH_TTL_S: Final = 120.0
DEFAULT_REQUEST_TIMEOUT_S: Final = 5.0
CONTAINER_NAME: Final = "daemon"
TOKEN_KEY: Final = "token"
NAME_PREFIX: Final = "lakeshore-"
MAX_MESSAGE: Final = 300

_LABEL_NAME = r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_DNS_SUBDOMAIN = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*"
LABEL_VALUE_RE: Final = re.compile(rf"(?:{_LABEL_NAME})?")
LABEL_KEY_RE: Final = re.compile(rf"(?:(?P<prefix>{_DNS_SUBDOMAIN})/)?{_LABEL_NAME}")
DNS_LABEL_RE: Final = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")
DNS_SUBDOMAIN_RE: Final = re.compile(_DNS_SUBDOMAIN)
QUANTITY_RE: Final = re.compile(
    r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|[munkMGTPE])?"
)
HOST_RE: Final = re.compile(r"https?://[^\s/?#]+(?:/[^\s?#]*)?")


# --- config --------------------------------------------------------------------------------


def _dns_label(value: str) -> str:
    if not DNS_LABEL_RE.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a Kubernetes namespace name: 1-63 lowercase letters, digits "
            "and '-', starting and ending with a letter or a digit"
        )
    return value


def _dns_subdomain(value: str) -> str:
    if len(value) > 253 or not DNS_SUBDOMAIN_RE.fullmatch(value):
        raise ValueError(f"{value!r} is not a Kubernetes object name (a DNS-1123 subdomain)")
    return value


def _label_key(value: str) -> str:
    match = LABEL_KEY_RE.fullmatch(value)
    prefix = match.group("prefix") if match else None
    name = value.rsplit("/", 1)[-1]
    if match is None or len(name) > 63 or (prefix is not None and len(prefix) > 253):
        raise ValueError(f"{value!r} is not a Kubernetes label key or resource name")
    return value


def _label_value(value: str) -> str:
    if not LABEL_VALUE_RE.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a Kubernetes label value: at most 63 letters, digits, '-', "
            "'_' and '.', starting and ending with a letter or a digit"
        )
    return value


def _number_as_text(value: Any) -> Any:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return value


def _quantity(value: str) -> str:
    if not QUANTITY_RE.fullmatch(value):
        raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. 500m, 2, 1Gi)")
    return value


def _host(value: str) -> str:
    if not HOST_RE.fullmatch(value):
        raise ValueError(f"{value!r} is not an http(s):// URL of a Kubernetes API server")
    return value.rstrip("/")


LabelKey = Annotated[str, AfterValidator(_label_key)]
LabelValue = Annotated[str, AfterValidator(_label_value)]
Quantity = Annotated[str, BeforeValidator(_number_as_text), AfterValidator(_quantity)]
Quantities = dict[LabelKey, Quantity]


class KubeResources(BaseModel):
    """The container's ``resources``: quantities by resource name (``cpu``, ``memory``, …)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    requests: Annotated[Quantities, Field(max_length=32)] | None = None
    limits: Annotated[Quantities, Field(max_length=32)] | None = None


class KubeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    namespace: Annotated[str, AfterValidator(_dns_label)] = "default"
    kubeconfig: Annotated[str, Field(min_length=1, max_length=4096)] | None = None
    context: Annotated[str, Field(min_length=1, max_length=253)] | None = None
    in_cluster: bool = False
    host: Annotated[str, Field(max_length=2048), AfterValidator(_host)] | None = None
    verify_ssl: bool = True
    image: Annotated[str, Field(min_length=1, max_length=1024)] | None = None
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = None
    service_account: Annotated[str, AfterValidator(_dns_subdomain)] | None = None
    resources: KubeResources | None = None
    extra_labels: Annotated[dict[LabelKey, LabelValue], Field(max_length=32)] = Field(
        default_factory=dict
    )
    request_timeout_s: Annotated[float, Field(gt=0, le=300)] = DEFAULT_REQUEST_TIMEOUT_S
    launch_ttl_s: Annotated[float, Field(gt=0, le=86_400)] = DEFAULT_LAUNCH_TTL_S
    boot_s: base.BootSeconds | None = None  # wait_target's boot time until it learns

    @model_validator(mode="after")
    def _one_way_in(self) -> KubeConfig:
        ways = [
            name
            for name, given in (
                ("host", self.host is not None),
                ("kubeconfig", self.kubeconfig is not None),
                ("in_cluster", self.in_cluster),
            )
            if given
        ]
        if len(ways) > 1:
            raise ValueError(f"give at most one of host, kubeconfig and in_cluster, not {ways}")
        if self.context is not None and (self.host is not None or self.in_cluster):
            raise ValueError(
                "context selects a kubeconfig context; it goes without host/in_cluster"
            )
        return self


# --- what a launch creates ------------------------------------------------------------------


def object_name(launch_id: str) -> str:
    """``lakeshore-<launch id>`` as a DNS-1123 label (Pod and Secret share it)."""
    cleaned = re.sub(r"[^a-z0-9-]+", "-", launch_id.lower()).strip("-")
    return (NAME_PREFIX + cleaned)[:63].rstrip("-")


def label_safe(value: str) -> str:
    """``value`` if Kubernetes takes it as a label value; else a cleaned form of it plus a
    short hash of the exact value (so two different values never share a label)."""
    if LABEL_VALUE_RE.fullmatch(value):
        return value
    digest = hashlib.sha256(value.encode()).hexdigest()[:8]
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "_", value)[:54].strip("-_.")
    return f"{cleaned}.{digest}" if cleaned else digest


def _metadata(name: str, config: KubeConfig, request: base.LaunchRequest) -> dict[str, Any]:
    ours = request.labels()
    labels = {**config.extra_labels, **{key: label_safe(value) for key, value in ours.items()}}
    return {
        "name": name,
        "namespace": config.namespace,
        "labels": labels,
        "annotations": dict(ours),
    }


def secret_manifest(name: str, config: KubeConfig, request: base.LaunchRequest) -> dict[str, Any]:
    """The Secret carrying the launch's worker token."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(name, config, request),
        "type": "Opaque",
        "immutable": True,
        "stringData": {TOKEN_KEY: request.token or ""},
    }


def shell_script(request: base.LaunchRequest) -> str | None:
    """The ``/bin/sh -c`` script that runs the template's bootstrap script and setup
    commands, then execs the daemon with the arguments after it; None when there are none."""
    steps = [request.body.bootstrap_script or "", *request.body.setup_commands]
    steps = [step for step in steps if step.strip()]
    if not steps:
        return None
    return "\n".join(["set -e", *steps, 'exec lakeshore "$@"']) + "\n"


def _env(request: base.LaunchRequest, secret: str | None) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": key, "value": value}
        for key, value in request.daemon_env().items()
        if key != "LAKESHORE_TOKEN"
    ]
    if secret is not None:
        ref = {"secretKeyRef": {"name": secret, "key": TOKEN_KEY}}
        env.append({"name": "LAKESHORE_TOKEN", "valueFrom": ref})
    return env


INSTANCE_TYPE_LABEL: Final = "node.kubernetes.io/instance-type"


def _resources(config: KubeConfig, request: base.LaunchRequest) -> dict[str, Any]:
    """The config's requests and limits; without a CPU request, one CPU per invocation the
    daemon runs at once (its ``capacity``), so the scheduler places it where it fits."""
    resources: dict[str, Any] = (
        config.resources.model_dump(exclude_none=True) if config.resources else {}
    )
    requests = dict(resources.get("requests") or {})
    if "cpu" not in requests:
        requests["cpu"] = str(request.body.capacity)
        resources["requests"] = requests
    return resources


def pod_manifest(
    name: str, config: KubeConfig, request: base.LaunchRequest, image: str, secret: str | None
) -> dict[str, Any]:
    """The Pod of one launch: one container running the daemon."""
    script = shell_script(request)
    command = ["lakeshore"] if script is None else ["/bin/sh", "-c", script, "lakeshore"]
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": image,
        "command": command,
        "args": request.daemon_args(),
        "env": _env(request, secret),
    }
    if config.image_pull_policy is not None:
        container["imagePullPolicy"] = config.image_pull_policy
    resources = _resources(config, request)
    if resources:
        container["resources"] = resources
    spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [container]}
    if request.body.instance_type:  # the well-known label every node carries
        spec["nodeSelector"] = {INSTANCE_TYPE_LABEL: request.body.instance_type}
    if config.service_account is not None:
        spec["serviceAccountName"] = config.service_account
    else:  # the daemon runs user code and needs no Kubernetes API token
        spec["automountServiceAccountToken"] = False
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _metadata(name, config, request),
        "spec": spec,
    }


# --- talking to the API ---------------------------------------------------------------------
