"""The provider protocol, the kinds a registration may name, and their configs.

``launch(request)`` starts one daemon and returns a JSON *handle* (what ``terminate``
needs later: a pid, a pod name, an instance id); ``terminate(handle)`` stops it. Both may
raise :class:`LaunchError` with a message for the audit row; anything else they raise is
reported the same way by the controller, which also bounds every call in time.

Kinds: ``fake`` records requests and launches nothing (dry runs, tests); ``ssh`` and
``slurm`` can be registered and refuse every launch with a clear reason, as the reference
pages say. ``local``, ``kube``, ``ec2`` and ``gce`` are the real providers.
"""

from __future__ import annotations

import importlib.util
import shlex
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Final, Generic, Protocol, TypeVar

from pydantic import BaseModel, Field, ValidationError

from lakeshore.defaults import DIST_NAME
from lakeshore.distribution import Wheel, own_wheel
from lakeshore.domain.fleet import LaunchBody
from lakeshore.domain.validation import invalid_input
from lakeshore.elasticity.estimates import MAX_CONFIGURED_BOOT_S
from lakeshore.errors import InvalidInput

T = TypeVar("T")

DEFAULT_LAUNCH_TTL_S: Final = 15.0
"""How long a launch counts as in flight when its daemon never says hello."""


class LaunchError(Exception):
    """A provider could not launch or terminate; the message goes into the audit row."""


class Attempt(Generic[T]):
    """A launch in flight, between the coroutine (which the controller's time-out may
    cancel) and the thread making the resource. The thread ``deliver``s what it made and
    deletes it itself if the caller has already given up; a caller that gives up
    ``abandon``s, and what was delivered meanwhile is deleted in the background. Either
    way nothing made for a launch nobody waits for is left running."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._abandoned = False
        self._made: T | None = None

    def deliver(self, made: T) -> bool:
        """Whether the caller still wants ``made`` (if not, the thread deletes it)."""
        with self._lock:
            self._made = made
            return not self._abandoned

    def abandon(self, delete: Callable[[T], None]) -> None:
        with self._lock:
            self._abandoned = True
            made = self._made
        if made is not None:
            threading.Thread(target=delete, args=(made,), daemon=True).start()


# What a daemon launched on this machine inherits from the server's environment: where
# programs, home, locale and temporary files are, and where Python finds code. Nothing else:
# the admin token, the database URL (with its password) and any cloud credentials stay on
# the server, out of reach of the UDFs the daemon runs. A provider's ``env`` adds to it.
INHERITED_ENV = (
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM",
    "PYTHONPATH", "VIRTUAL_ENV",
)  # fmt: skip


def inherited_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The part of ``environ`` a launched daemon may see (:data:`INHERITED_ENV`, ``LC_*``)."""
    return {k: v for k, v in environ.items() if k in INHERITED_ENV or k.startswith("LC_")}


@dataclass(frozen=True)
class LaunchRequest:
    """One daemon to start: who it is, where it reports, what it serves."""

    launch_id: str
    namespace: str
    scope: str  # the queue's name, or "pool:<name>"
    server_url: str
    token: str | None  # a worker token minted for this launch
    body: LaunchBody

    def daemon_args(self) -> list[str]:
        """``lakeshore daemon run`` arguments for this launch (its URL and token go by
        environment: ``daemon_env``). Cloud tags become daemon tags ``key:value``."""
        args = ["daemon", "run", "--launch-id", self.launch_id]
        args += ["--capacity", str(self.body.capacity)]
        for queue in self.body.queues:
            args += ["--queue", queue]
        for runner in self.body.runners:
            args += ["--runner", runner]
        for key, value in sorted(self.body.cloud_tags.items()):
            args += ["--tag", f"{key}:{value}"]
        return args

    def daemon_env(self) -> dict[str, str]:
        """What the daemon reads from its environment: where the server is, its token, and
        its namespace."""
        env = {"LAKESHORE_URL": self.server_url, "LAKESHORE_NAMESPACE": self.namespace}
        if self.token:
            env["LAKESHORE_TOKEN"] = self.token
        return env

    def labels(self) -> dict[str, str]:
        """What a provider tags its instance or pod with, to find it again."""
        return {
            "lakeshore-launch-id": self.launch_id,
            "lakeshore-namespace": self.namespace,
            "lakeshore-scope": self.scope,
        }

    def startup_script(self, install_command: str) -> str:
        """A bash script for a fresh machine (EC2 user-data, a GCE startup script): the
        template's bootstrap script, its setup commands in order, the daemon's environment,
        the install command, then the daemon in the foreground (with the interpreter the
        install used). Any failing step stops the script. When the daemon exits (retired,
        or its token refused because its launch was given up on) the machine powers itself
        off, so a machine nobody uses does not keep running."""
        lines = ["#!/bin/bash", "set -euo pipefail"]
        if self.body.bootstrap_script:
            lines.append(self.body.bootstrap_script)
        lines.extend(self.body.setup_commands)
        lines.extend(
            f"export {key}={shlex.quote(value)}" for key, value in self.daemon_env().items()
        )
        lines.append(install_command)
        lines.append(shlex.join(["python3", "-m", "lakeshore", *self.daemon_args()]) + " || true")
        lines.append("shutdown -h now || poweroff")
        return "\n".join(lines) + "\n"


# Run by python3 on the launched machine: fetch the control plane's wheel with the
# daemon's token, retrying while the machine's network comes up, and check its checksum.
_FETCH = """\
import hashlib, os, sys, time, urllib.error, urllib.request
url = os.environ["LAKESHORE_URL"].rstrip("/") + "/v1/dist/{filename}"
token = os.environ.get("LAKESHORE_TOKEN", "")
request = urllib.request.Request(url, headers={{"Authorization": "Bearer " + token}})
for attempt in range(12):
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            data = answer.read()
        break
    except urllib.error.HTTPError as exc:
        if exc.code < 500:  # refused or not there: trying again changes nothing
            sys.exit(f"lakeshore: fetching {{url}}: {{exc}}")
        print(f"lakeshore: fetching {{url}}: {{exc}}", file=sys.stderr)
    except OSError as exc:
        print(f"lakeshore: fetching {{url}}: {{exc}}", file=sys.stderr)
    time.sleep(min(2 ** attempt, 30))
else:
    sys.exit(f"lakeshore: could not fetch {{url}}")
if hashlib.sha256(data).hexdigest() != "{sha256}":
    sys.exit(f"lakeshore: the wheel from {{url}} does not match its checksum {sha256}")
with open(sys.argv[1], "wb") as out:
    out.write(data)
"""


def default_install_command(wheel: Wheel | None = None) -> str:
    """How a fresh machine comes to run this server's exact code: unless its python3
    already has it (an image built with it: the same wheel checksum), fetch the server's
    own wheel from the control plane (``GET /v1/dist/…``, checked against its SHA-256) and
    install it with its dependencies from the package index. The image needs python3 with
    pip (a bootstrap script or setup command can install them)."""
    wheel = wheel or own_wheel()
    same = (
        "python3 -c 'import sys; from lakeshore.distribution import own_wheel; "
        f'sys.exit(own_wheel().sha256 != "{wheel.sha256}")\' 2>/dev/null'
    )
    fetch = _FETCH.format(filename=wheel.filename, sha256=wheel.sha256)
    return "\n".join(
        [
            f"if {same}; then",
            f'  echo "lakeshore: {DIST_NAME} {wheel.version} ({wheel.sha256[:12]}) is installed"',
            "else",
            f'  LAKESHORE_WHEEL="$(mktemp -d)/{wheel.filename}"',
            "  python3 - \"$LAKESHORE_WHEEL\" <<'LAKESHORE_FETCH'",
            fetch.rstrip("\n"),
            "LAKESHORE_FETCH",
            '  python3 -m pip install --quiet "$LAKESHORE_WHEEL"',
            "  # the same version with other code may be there already: this code wins",
            '  python3 -m pip install --quiet --force-reinstall --no-deps "$LAKESHORE_WHEEL"',
            "fi",
        ]
    )


BootSeconds = Annotated[float, Field(gt=0, le=MAX_CONFIGURED_BOOT_S)]
"""A kind's optional ``boot_s``: how long its launches take from request to hello, as
its operator expects; ``wait_target`` plans with it until it has learned the boot time
from the provider's own launches (:mod:`lakeshore.elasticity.estimates`)."""


class Provider(Protocol):
    """A kind of fleet. ``launch_ttl_s``: how long a launch stays in flight after the
    provider answered, waiting for its daemon's hello. A provider whose launch call does
    slow work of its own (``local`` runs setup scripts) may also define
    ``launch_timeout(request) -> float``: how long to wait for that call, when longer than
    the controller's call time-out."""

    name: str
    kind: str
    launch_ttl_s: float

    async def launch(self, request: LaunchRequest) -> dict[str, Any]: ...

    async def terminate(self, handle: Mapping[str, Any], worker_id: str) -> None: ...


@dataclass(frozen=True)
class Kind:
    config: type[BaseModel]
    factory: Callable[[str, Any], Provider]
    admin_only: bool = False  # runs code on the server's machine, or with its credentials
    sdk: str | None = None  # the client library it needs, e.g. "boto3"
    extra: str | None = None  # the package's extra that installs that library, e.g. "aws"


def sdk_installed(module: str) -> bool:
    """Whether ``module`` can be imported here (found, not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing_extra(kind: str) -> str | None:
    """What to install before a provider of ``kind`` can run here, or None: the cloud
    SDKs come with the package's extras (``aws``, ``gcp``, ``kube``), not by default."""
    spec = KINDS.get(kind)
    if spec is None or spec.sdk is None or sdk_installed(spec.sdk):
        return None
    return (
        f'provider kind "{kind}" needs {spec.sdk}, which this server does not have: '
        f"install the {spec.extra} extra (pip install '{DIST_NAME}[{spec.extra}]') and restart"
    )


KINDS: dict[str, Kind] = {}


def register(kind: str, spec: Kind) -> None:
    KINDS[kind] = spec


def parse_config(kind: str, config: Any) -> BaseModel:
    """Validate a registration's config for its kind (422 naming the field)."""
    spec = KINDS.get(kind)
    if spec is None:
        raise InvalidInput(
            f'unknown provider kind "{kind}"; expected one of {", ".join(sorted(KINDS))}',
            field="kind",
        )
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise InvalidInput("config is a JSON object", field="config")
    try:
        return spec.config.model_validate(config)
    except ValidationError as exc:
        raise invalid_input(exc, prefix=("config",)) from exc


def build(name: str, kind: str, config: Any) -> Provider:
    """The provider a stored registration describes (a LaunchError when its SDK is not
    installed here)."""
    missing = missing_extra(kind)
    if missing:
        raise LaunchError(missing)
    parsed = parse_config(kind, config)
    return KINDS[kind].factory(name, parsed)


# each module registers its kinds with ``install()``; clients are imported lazily inside
# the providers, so the server starts without loading every cloud SDK
_MODULES = ("fake", "unsupported", "local", "gce", "ec2", "kube")


def _install() -> None:
    import importlib

    for name in _MODULES:
        importlib.import_module(f"lakeshore.providers.{name}").install()


_install()
