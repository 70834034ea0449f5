"""The ``gce`` provider: one Compute Engine instance per launch, through google-cloud-compute.

A launch is ``instances.insert`` of an instance named ``lakeshore-<launch id>`` with the
template's machine type (``instance_type``, else the config's ``machine_type``), a boot
disk from the template's ``image_id`` (else the config's ``image``; neither is a launch
failure), one network interface, labels (the config's ``extra_labels``, the template's
``cloudTags``, then our own launch id / namespace / scope labels, all made to fit GCE's
label rules) and a ``startup-script`` metadata item that installs Lakeshore and runs the
daemon (:meth:`~lakeshore.providers.base.LaunchRequest.startup_script`). The handle is
``{"instance", "project", "zone"}``; terminate is ``instances.delete`` of it (an instance
that is already gone is fine).

The launch waits for nothing beyond the insert call's answer: GCE accepts the request and
answers with a zone operation at once, but the operation itself takes tens of seconds,
longer than the controller's per-call time-out. The operation is checked for an error it
already carries; an insert that fails later (quota, a bad image) shows up as a daemon that
never says hello, and the launch tracker's TTL (``launch_ttl_s``, 300 s by default) frees
its slot. Polling is left out on purpose: the library's own poller
(``ExtendedOperation.result``) asks ``compute.googleapis.com`` whatever ``api_endpoint``
says, so the unary calls (``insert_unary`` / ``delete_unary``) are used.

Credentials are Google's application default credentials, unless ``api_endpoint`` is set
(tests, private endpoints speaking the same REST API): then the client talks to that URL
(``http://`` allowed) with anonymous credentials. Since a registration acts with the
server's own credentials, only the admin token may register one. The client is blocking,
so every call runs in a thread; ``google.cloud.compute_v1`` is imported inside those calls
only, since this module is imported at server start.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Annotated, Any, Final, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from lakeshore.distribution import own_wheel
from lakeshore.providers import base

if TYPE_CHECKING:
    from google.cloud import compute_v1

T = TypeVar("T")
log = logging.getLogger("lakeshore.providers.gce")

DEFAULT_LAUNCH_TTL_S: Final = 300.0  # instances boot in minutes, not seconds
DEFAULT_MACHINE_TYPE: Final = "e2-medium"
DEFAULT_NETWORK: Final = "global/networks/default"
REQUEST_TIMEOUT_S: Final = 30.0  # one HTTP call; the controller bounds the launch itself
SERVICE_ACCOUNT_SCOPES: Final = ("https://www.googleapis.com/auth/cloud-platform",)
MAX_LABELS: Final = 64  # GCE's limit per resource
LABEL_MAX_LEN: Final = 63
NAME_MAX_LEN: Final = 63

_NOT_LABEL_CHAR = re.compile(r"[^a-z0-9_-]")
_NOT_NAME_CHAR = re.compile(r"[^a-z0-9-]")

Resource = Annotated[str, Field(min_length=1, max_length=1024, pattern=r"^\S+$")]
LabelKey = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]{0,62}$")]
LabelValue = Annotated[str, Field(pattern=r"^[a-z0-9_-]{0,63}$")]


class GceConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    project: Annotated[str, Field(max_length=100, pattern=r"^[a-z0-9][a-z0-9.:-]*$")]
    zone: Annotated[str, Field(max_length=63, pattern=r"^[a-z][a-z0-9]*(-[a-z0-9]+)+$")]
    network: Resource | None = None
    subnetwork: Resource | None = None
    machine_type: Resource = DEFAULT_MACHINE_TYPE
    image: Resource | None = None
    service_account: Annotated[str, Field(max_length=320, pattern=r"^[^@\s]+@[^@\s]+$")] | None = (
        None
    )
    external_ip: bool = True
    api_endpoint: (
        Annotated[str, Field(max_length=1024, pattern=r"^https?://[^\s/?#]+/?$")] | None
    ) = None
    install_command: Annotated[str, Field(min_length=1, max_length=16_384)] | None = None
    launch_ttl_s: Annotated[float, Field(gt=0, le=86_400)] = DEFAULT_LAUNCH_TTL_S
    boot_s: base.BootSeconds | None = None  # wait_target's boot time until it learns
    extra_labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=32)


# --- what is sent: pure functions of the config and the request --------------------------


def instance_name(launch_id: str) -> str:
    """``lakeshore-<launch id>`` as GCE accepts it: ``[a-z]([-a-z0-9]*[a-z0-9])?``, ≤ 63."""
    name = _NOT_NAME_CHAR.sub("-", f"lakeshore-{launch_id}".lower())
    return name[:NAME_MAX_LEN].rstrip("-")


def label_value(text: str) -> str:
    """Lowercase, ``[a-z0-9_-]`` (anything else becomes ``-``), at most 63 characters."""
    return _NOT_LABEL_CHAR.sub("-", text.lower())[:LABEL_MAX_LEN]


def label_key(text: str) -> str | None:
    """A label value that also starts with a letter (``k`` is put in front when it does
    not); ``None`` for an empty key."""
    key = label_value(text)
    if not key:
        return None
    return key if "a" <= key[0] <= "z" else ("k" + key)[:LABEL_MAX_LEN]


def _sanitized(labels: Mapping[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in labels.items():
        if (clean := label_key(key)) is not None:
            out[clean] = label_value(value)
    return out


def instance_labels(config: GceConfig, request: base.LaunchRequest) -> dict[str, str]:
    """``extra_labels``, then ``cloudTags``, then our own labels (which win a clash and are
    never dropped); the others are cut to GCE's 64 labels in that order."""
    ours = _sanitized(request.labels())
    others = _sanitized({**config.extra_labels, **request.body.cloud_tags})
    kept = [(k, v) for k, v in others.items() if k not in ours][: MAX_LABELS - len(ours)]
    return {**dict(kept), **ours}


def _path(value: str, prefix: str) -> str:
    """A bare name under ``prefix``; a path or URL (anything with ``/``) as given."""
    return value if "/" in value else f"{prefix}{value}"


def _network_interface(config: GceConfig) -> dict[str, Any]:
    interface: dict[str, Any] = {}
    if config.network is not None:
        interface["network"] = _path(config.network, "global/networks/")
    elif config.subnetwork is None:
        interface["network"] = DEFAULT_NETWORK
    if config.subnetwork is not None:
        region = config.zone.rsplit("-", 1)[0]
        interface["subnetwork"] = _path(config.subnetwork, f"regions/{region}/subnetworks/")
    if config.external_ip:
        interface["access_configs"] = [{"name": "External NAT", "type_": "ONE_TO_ONE_NAT"}]
    return interface


def instance_spec(config: GceConfig, request: base.LaunchRequest) -> dict[str, Any]:
    """The ``Instance`` resource for one launch (proto field names), or a LaunchError when
    no image is known."""
    image = request.body.image_id or config.image
    if image is None:
        raise base.LaunchError(
            "no image to boot: set daemonTemplate.image_id on the queue or image in the "
            "gce provider's config"
        )
    machine_type = request.body.instance_type or config.machine_type
    install = config.install_command or base.default_install_command()
    spec: dict[str, Any] = {
        "name": instance_name(request.launch_id),
        "machine_type": _path(machine_type, f"zones/{config.zone}/machineTypes/"),
        "disks": [
            {
                "boot": True,
                "auto_delete": True,
                "initialize_params": {"source_image": _path(image, "global/images/")},
            }
        ],
        "network_interfaces": [_network_interface(config)],
        "labels": instance_labels(config, request),
        "metadata": {
            "items": [{"key": "startup-script", "value": request.startup_script(install)}]
        },
    }
    if config.service_account is not None:
        spec["service_accounts"] = [
            {"email": config.service_account, "scopes": list(SERVICE_ACCOUNT_SCOPES)}
        ]
    return spec


def _handle_fields(handle: Mapping[str, Any]) -> tuple[str, str, str]:
    values = tuple(handle.get(key) for key in ("project", "zone", "instance"))
    if not all(isinstance(v, str) and v for v in values):
        raise base.LaunchError(f"not a gce handle: {dict(handle)!r}")
    project, zone, instance = values
    return str(project), str(zone), str(instance)


# --- the calls ---------------------------------------------------------------------------


def _explain(what: str, exc: Exception) -> base.LaunchError:
    """The LaunchError for anything the client library raised: credentials, API errors,
    answers that are not Compute Engine's, transport failures; the rest by type name."""
    from google.api_core import exceptions as api_exceptions
    from google.auth import exceptions as auth_exceptions
    from google.protobuf import json_format  # type: ignore[import-untyped]  # no stubs

    if isinstance(exc, auth_exceptions.DefaultCredentialsError):
        return base.LaunchError(f"no Google Cloud credentials found ({exc})")
    if isinstance(exc, auth_exceptions.GoogleAuthError):
        return base.LaunchError(f"GCE {what}: Google Cloud authentication failed: {exc}")
    if isinstance(exc, api_exceptions.GoogleAPICallError):
        detail = f"{exc.code} {exc.message}" if exc.code else str(exc)
        return base.LaunchError(f"GCE {what}: the Compute Engine API answered {detail}")
    if isinstance(exc, json_format.Error | UnicodeError):
        return base.LaunchError(f"GCE {what}: not a Compute Engine answer ({exc})")
    if isinstance(exc, OSError):  # requests' ConnectionError, Timeout, … are OSErrors
        return base.LaunchError(f"GCE {what}: cannot reach the Compute Engine API: {exc}")
    return base.LaunchError(f"GCE {what}: {type(exc).__name__}: {exc}")


def _check_operation(what: str, operation: compute_v1.Operation) -> None:
    """An operation that is no operation, or that already failed, is a LaunchError."""
    if not operation.name:
        raise base.LaunchError(f"GCE {what}: not a Compute Engine answer (no operation name)")
    errors = [e.message or e.code for e in operation.error.errors]
    if errors or operation.http_error_status_code >= 400:
        message = "; ".join(errors) or operation.http_error_message
        raise base.LaunchError(f"GCE {what}: the operation failed: {message}")


class GceProvider:
    kind = "gce"

    def __init__(self, name: str, config: GceConfig) -> None:
        self.name = name
        self.config = config
        self.launch_ttl_s = config.launch_ttl_s

    async def launch(self, request: base.LaunchRequest) -> dict[str, Any]:
        if self.config.install_command is None:  # the default install names the wheel:
            await asyncio.to_thread(own_wheel)  # built once, off the loop
        spec = instance_spec(self.config, request)
        project, zone, name = self.config.project, self.config.zone, spec["name"]
        attempt: base.Attempt[str] = base.Attempt()

        def insert() -> None:
            self._insert(project, zone, spec)
            if not attempt.deliver(name):
                self._delete_quietly(project, zone, name)
                raise base.LaunchError(f"launch abandoned; instance {name} deleted")

        try:
            await self._run(f"insert of {name}", insert)
        except asyncio.CancelledError:  # timed out: what the call still makes is deleted
            attempt.abandon(lambda made: self._delete_quietly(project, zone, made))
            raise
        return {"instance": name, "project": project, "zone": zone}

    def _delete_quietly(self, project: str, zone: str, instance: str) -> None:
        try:
            self._delete(project, zone, instance)
        except Exception:  # best effort, in the background: the log says what is left
            log.exception("could not delete abandoned instance %s in %s", instance, zone)

    async def terminate(self, handle: Mapping[str, Any], worker_id: str) -> None:
        project, zone, instance = _handle_fields(handle)
        await self._run(f"delete of {instance}", lambda: self._delete(project, zone, instance))

    async def _run(self, what: str, call: Callable[[], T]) -> T:
        try:
            return await asyncio.to_thread(call)
        except base.LaunchError:
            raise
        except Exception as exc:
            raise _explain(what, exc) from exc

    def _client(self) -> compute_v1.InstancesClient:
        from google.cloud import compute_v1

        endpoint = self.config.api_endpoint
        if endpoint is None:
            return compute_v1.InstancesClient(transport="rest")
        from google.auth.credentials import AnonymousCredentials

        return compute_v1.InstancesClient(
            credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
            transport="rest",
            client_options={"api_endpoint": endpoint.rstrip("/")},
        )

    def _insert(self, project: str, zone: str, spec: dict[str, Any]) -> None:
        from google.cloud import compute_v1

        with self._client() as client:
            operation = client.insert_unary(
                project=project,
                zone=zone,
                instance_resource=compute_v1.Instance(spec),
                retry=None,
                timeout=REQUEST_TIMEOUT_S,
            )
        _check_operation(f"insert of {spec['name']}", operation)

    def _delete(self, project: str, zone: str, instance: str) -> None:
        from google.api_core import exceptions as api_exceptions

        with self._client() as client:
            try:
                operation = client.delete_unary(
                    project=project,
                    zone=zone,
                    instance=instance,
                    retry=None,
                    timeout=REQUEST_TIMEOUT_S,
                )
            except api_exceptions.NotFound:
                return  # already gone: that is what terminate wants
        _check_operation(f"delete of {instance}", operation)


def install() -> None:
    # it acts with the server's own Google Cloud credentials (and may attach a service
    # account to a machine running the template's scripts): the admin token registers it
    base.register(
        "gce",
        base.Kind(
            config=GceConfig,
            factory=GceProvider,
            admin_only=True,
            sdk="google.cloud.compute_v1",
            extra="gcp",
        ),
    )
