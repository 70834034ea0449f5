"""The ``ec2`` provider: one EC2 instance per launch, through boto3's client (botocore).

A launch is one ``RunInstances`` (``MinCount = MaxCount = 1``) with the daemon template's
``instance_type`` / ``image_id`` (else the config's defaults), the instance tagged with the
template's ``cloudTags``, the launch's labels (``lakeshore-launch-id``, …) and a ``Name``,
and user-data that runs the template's bootstrap script and setup commands, installs
Lakeshore and starts the daemon (:meth:`LaunchRequest.startup_script`). Its handle is
``{"instance_id", "region"}``; terminate is ``TerminateInstances`` on that id, and an
instance that is already gone is not an error.

Credentials come from the standard AWS chain (environment, shared files, an instance or
task role), or from a named ``profile``. ``endpoint_url`` points the client elsewhere (moto,
LocalStack, a VPC endpoint). boto3 blocks, so every call runs in a thread; the controller
bounds it in time. A launch whose caller gave up (a time-out) terminates its instance as
soon as ``RunInstances`` answers, so a slow answer leaves no orphan behind. Every failure
becomes a :class:`LaunchError` with a short message. The AWS SDK is imported on first
use, so the server starts without loading it, and its parsed API models are shared between
clients (credentials are looked up per client).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import threading
from collections.abc import Mapping
from typing import Annotated, Any, Final

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictStr

from lakeshore import __version__
from lakeshore.distribution import own_wheel
from lakeshore.providers import base

DEFAULT_LAUNCH_TTL_S: Final = 300.0  # instances take minutes to boot and say hello
MAX_USER_DATA: Final = 16_384  # bytes, before base64: EC2's own limit
MAX_TAGS: Final = 50  # per resource
MAX_TAG_KEY: Final = 128
MAX_TAG_VALUE: Final = 256
MAX_MESSAGE: Final = 500
CONNECT_TIMEOUT_S: Final = 5
READ_TIMEOUT_S: Final = 30
MAX_ATTEMPTS: Final = 2  # one retry on a throttle or a dropped connection

# what every AWS service accepts in a tag: letters, digits, spaces and + - = . _ : / @
_TAG_UNSAFE = re.compile(r"[^\w +\-=.:/@]")
_TAG_TEXT = r"^[\w +\-=.:/@]*$"
_INSTANCE_ID = re.compile(r"i-[0-9a-zA-Z]{1,64}")
_NOT_FOUND = frozenset({"InvalidInstanceID.NotFound"})


def _not_reserved(key: str) -> str:
    if key.lower().startswith("aws:"):
        raise ValueError('tag keys starting with "aws:" are reserved by AWS')
    return key


TagKey = Annotated[
    StrictStr,
    Field(min_length=1, max_length=MAX_TAG_KEY, pattern=_TAG_TEXT),
    AfterValidator(_not_reserved),
]
TagValue = Annotated[StrictStr, Field(max_length=MAX_TAG_VALUE, pattern=_TAG_TEXT)]
Word = Annotated[StrictStr, Field(min_length=1, max_length=1024, pattern=r"^\S+$")]


class Ec2Config(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    region: Annotated[StrictStr, Field(max_length=32, pattern=r"^[a-z0-9]+(-[a-z0-9]+)*$")]
    profile: Annotated[StrictStr, Field(min_length=1, max_length=128)] | None = None
    endpoint_url: (
        Annotated[StrictStr, Field(max_length=2048, pattern=r"^https?://[^\s/?#]+(/\S*)?$")] | None
    ) = None
    subnet_id: Annotated[StrictStr, Field(pattern=r"^subnet-[0-9a-f]{1,32}$")] | None = None
    security_group_ids: list[Annotated[StrictStr, Field(pattern=r"^sg-[0-9a-f]{1,32}$")]] = Field(
        default_factory=list, max_length=16
    )
    key_name: Annotated[StrictStr, Field(min_length=1, max_length=255)] | None = None
    # a name, or an ARN (arn:aws:iam::123456789012:instance-profile/name)
    instance_profile: (
        Annotated[
            StrictStr,
            Field(
                max_length=2048,
                pattern=(
                    r"^(arn:aws[a-z-]*:iam::[0-9]{12}:instance-profile/[A-Za-z0-9_+=,.@/-]+"
                    r"|[A-Za-z0-9_+=,.@-]{1,128})$"
                ),
            ),
        ]
        | None
    ) = None
    instance_type: Annotated[StrictStr, Field(max_length=64, pattern=r"^\S+$")] | None = None
    image_id: Word | None = None  # an AMI id, or resolve:ssm:<parameter>
    # unset: install this server's own version (base.default_install_command)
    install_command: Annotated[StrictStr, Field(min_length=1, max_length=4096)] | None = None
    launch_ttl_s: Annotated[float, Field(gt=0, le=86_400)] = DEFAULT_LAUNCH_TTL_S
    boot_s: base.BootSeconds | None = None  # wait_target's boot time until it learns
    extra_tags: dict[TagKey, TagValue] = Field(default_factory=dict, max_length=MAX_TAGS)


class Ec2Provider:
    kind = "ec2"

    def __init__(self, name: str, config: Ec2Config) -> None:
        self.name = name
        self.config = config
        self.launch_ttl_s = config.launch_ttl_s
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()

    # --- the protocol -------------------------------------------------------------------

    async def launch(self, request: base.LaunchRequest) -> dict[str, Any]:
        if self.config.install_command is None:  # the default install names the wheel:
            await asyncio.to_thread(own_wheel)  # built once, off the loop
        params = self.run_params(request)
        attempt: base.Attempt[str] = base.Attempt()
        try:
            instance_id = await asyncio.to_thread(self._run_instance, params, attempt)
        except asyncio.CancelledError:  # timed out: whatever launches now is terminated
            attempt.abandon(self._terminate_quietly)
            raise
        return {"instance_id": instance_id, "region": self.config.region}

    async def terminate(self, handle: Mapping[str, Any], worker_id: str) -> None:
        instance_id = handle.get("instance_id")
        if not isinstance(instance_id, str) or not _INSTANCE_ID.fullmatch(instance_id):
            raise base.LaunchError(f"handle {dict(handle)!r} names no EC2 instance")
        region = handle.get("region")
        if not isinstance(region, str) or not region:
            region = self.config.region
        await asyncio.to_thread(self._terminate_instance, instance_id, region)

    # --- the request ------------------------------------------------------------------

    def run_params(self, request: base.LaunchRequest) -> dict[str, Any]:
        """``RunInstances`` arguments for ``request`` (a LaunchError when it cannot be)."""
        body, config = request.body, self.config
        image_id = body.image_id or config.image_id
        instance_type = body.instance_type or config.instance_type
        missing = [
            key
            for key, value in (("image_id", image_id), ("instance_type", instance_type))
            if not value
        ]
        if missing:
            raise base.LaunchError(
                f"no {' and no '.join(missing)} for the EC2 instance: set "
                f"{' and '.join('daemonTemplate.' + key for key in missing)} on the queue, "
                f'or a default in provider "{self.name}"\'s config'
            )
        install = config.install_command or base.default_install_command()
        user_data = request.startup_script(install)
        size = len(user_data.encode())
        if size > MAX_USER_DATA:
            raise base.LaunchError(
                f"user-data is {size} bytes and EC2 takes at most {MAX_USER_DATA}: shorten "
                "the template's bootstrap script or setup scripts"
            )
        params: dict[str, Any] = {
            "ImageId": image_id,
            "InstanceType": instance_type,
            "MinCount": 1,
            "MaxCount": 1,
            "UserData": user_data,
            "InstanceInitiatedShutdownBehavior": "terminate",
            "TagSpecifications": [{"ResourceType": "instance", "Tags": self.tags(request)}],
        }
        if len(request.launch_id) <= 64:  # idempotent if botocore retries the call
            params["ClientToken"] = request.launch_id
        params.update(self._placement())
        return params

    def _placement(self) -> dict[str, Any]:
        config = self.config
        params: dict[str, Any] = {}
        if config.subnet_id:
            params["SubnetId"] = config.subnet_id
        if config.security_group_ids:
            params["SecurityGroupIds"] = list(config.security_group_ids)
        if config.key_name:
            params["KeyName"] = config.key_name
        if config.instance_profile:
            key = "Arn" if config.instance_profile.startswith("arn:") else "Name"
            params["IamInstanceProfile"] = {key: config.instance_profile}
        return params

    def tags(self, request: base.LaunchRequest) -> list[dict[str, str]]:
        """The instance's tags: a ``Name``, the config's ``extra_tags``, the template's
        ``cloudTags``, and the launch's labels, each overriding the ones before."""
        merged: dict[str, str] = {}
        name = f"lakeshore-{request.scope}-{request.launch_id}"
        for source in (
            {"Name": name},
            self.config.extra_tags,
            request.body.cloud_tags,
            request.labels(),
        ):
            for key, value in source.items():
                if key.lower().startswith("aws:"):
                    raise base.LaunchError(f'tag key "{key}" is reserved by AWS (aws:*)')
                merged[_tag_text(key, MAX_TAG_KEY)] = _tag_text(value, MAX_TAG_VALUE)
        if len(merged) > MAX_TAGS:
            raise base.LaunchError(
                f"the instance would carry {len(merged)} tags and EC2 takes at most "
                f"{MAX_TAGS}: drop some cloudTags or extra_tags"
            )
        return [{"Key": key, "Value": value} for key, value in merged.items()]

    # --- the calls, in a thread ---------------------------------------------------------

    def _run_instance(self, params: dict[str, Any], attempt: base.Attempt[str]) -> str:
        try:
            response = self._client(self.config.region).run_instances(**params)
        except Exception as exc:
            raise base.LaunchError(explain(exc, "RunInstances", self.config)) from exc
        ids = _instance_ids(response)
        if len(ids) != 1:
            for instance_id in ids:  # more than asked for: leave nothing running
                self._terminate_quietly(instance_id)
            raise base.LaunchError(
                f"EC2 answered RunInstances with {len(ids)} instance ids instead of one"
            )
        if not attempt.deliver(ids[0]):
            self._terminate_quietly(ids[0])
            raise base.LaunchError(f"launch abandoned; instance {ids[0]} terminated")
        return ids[0]

    def _terminate_instance(self, instance_id: str, region: str) -> None:
        try:
            response = self._client(region).terminate_instances(InstanceIds=[instance_id])
        except Exception as exc:
            if _error_code(exc) in _NOT_FOUND:
                return  # gone already
            raise base.LaunchError(explain(exc, "TerminateInstances", self.config)) from exc
        confirmed = response.get("TerminatingInstances") if isinstance(response, dict) else None
        if not isinstance(confirmed, list) or not any(
            isinstance(item, dict) and item.get("InstanceId") == instance_id for item in confirmed
        ):
            raise base.LaunchError(f"EC2 did not confirm terminating {instance_id}")

    def _terminate_quietly(self, instance_id: str) -> None:
        # best effort: the launch has failed already, with its own reason
        with contextlib.suppress(base.LaunchError):
            self._terminate_instance(instance_id, self.config.region)

    def _client(self, region: str) -> Any:
        """This provider's EC2 client for ``region``, made on first use (thread-safe)."""
        with self._lock:
            client = self._clients.get(region)
            if client is None:
                client = self._clients[region] = _make_client(self.config, region)
            return client


def _make_client(config: Ec2Config, region: str) -> Any:
    """An EC2 client with its own credentials lookup (the standard chain, or ``profile``)."""
    import botocore.session
    from botocore.config import Config

    try:
        session = botocore.session.Session(profile=config.profile)
        session.register_component("data_loader", _data_loader())
        return session.create_client(
            "ec2",
            region_name=region,
            endpoint_url=config.endpoint_url,
            config=Config(
                connect_timeout=CONNECT_TIMEOUT_S,
                read_timeout=READ_TIMEOUT_S,
                retries={"mode": "standard", "total_max_attempts": MAX_ATTEMPTS},
                user_agent_extra=f"lakeshore/{__version__}",
            ),
        )
    except Exception as exc:
        raise base.LaunchError(explain(exc, "client setup", config)) from exc


@functools.cache
def _data_loader() -> Any:
    """botocore's loader of API models, shared: parsing EC2's model on every launch costs
    a few hundred milliseconds of CPU (holding the GIL); credentials are not shared."""
    from botocore.loaders import create_loader

    return create_loader()


def _instance_ids(response: Any) -> list[str]:
    """The instance ids in a ``RunInstances`` answer (a LaunchError when there are none)."""
    instances = response.get("Instances") if isinstance(response, dict) else None
    if not isinstance(instances, list) or not instances:
        raise base.LaunchError("EC2 answered RunInstances without any instance")
    ids = [item.get("InstanceId") if isinstance(item, dict) else None for item in instances]
    valid = [i for i in ids if isinstance(i, str) and _INSTANCE_ID.fullmatch(i)]
    if not valid:
        raise base.LaunchError("EC2 answered RunInstances without a valid instance id")
    return valid


def _tag_text(text: str, limit: int) -> str:
    return _TAG_UNSAFE.sub("_", text)[:limit]


def _error_code(exc: BaseException) -> str | None:
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None
    error = response.get("Error")
    code = error.get("Code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…"


def explain(exc: BaseException, operation: str, config: Ec2Config) -> str:
    """A short message for what the AWS client raised during ``operation``."""
    from botocore import exceptions as bx

    where = config.endpoint_url or f"EC2 in {config.region}"
    if isinstance(exc, base.LaunchError):
        return str(exc)
    if isinstance(exc, bx.NoCredentialsError):
        return (
            "no AWS credentials found (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
            "name a profile in the provider's config, or run with an instance role)"
        )
    if isinstance(exc, bx.PartialCredentialsError | bx.ProfileNotFound):
        return _short(f"AWS credentials are not usable: {exc}")
    if isinstance(exc, bx.ClientError):
        error = exc.response.get("Error", {})
        code, message = error.get("Code", "error"), error.get("Message", "")
        return _short(f"EC2 {operation} refused: {code}: {message}".rstrip(": "))
    if isinstance(exc, bx.EndpointConnectionError | bx.ConnectTimeoutError):
        return _short(f"cannot reach {where}: {exc}")
    if isinstance(exc, bx.ReadTimeoutError):
        return _short(f"{where} did not answer {operation} in time: {exc}")
    if isinstance(exc, bx.ParamValidationError):
        return _short(f"EC2 {operation} parameters refused by the client: {exc}")
    return _short(f"EC2 {operation} failed: {type(exc).__name__}: {exc}")


def install() -> None:
    # the server's own AWS credentials: only the admin may hand them to a namespace
    base.register(
        "ec2",
        base.Kind(config=Ec2Config, factory=Ec2Provider, admin_only=True, sdk="boto3", extra="aws"),
    )
