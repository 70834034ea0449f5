"""The ``kube`` provider: one Pod per launch, through the official ``kubernetes`` client.

A launch creates a Secret ``lakeshore-<launch id>`` holding the launch's worker token, then
a Pod of the same name: ``restartPolicy: Never``, one container ``daemon`` running
``lakeshore daemon run …`` (:meth:`LaunchRequest.daemon_args`), ``LAKESHORE_URL`` and
``LAKESHORE_NAMESPACE`` as plain environment values and ``LAKESHORE_TOKEN`` by
``secretKeyRef``. When the template has a bootstrap script or setup commands, the container
runs ``/bin/sh -c '<script>' lakeshore <daemon args>`` instead: the script is ``set -e``, the
bootstrap script, each setup command in order, then ``exec lakeshore "$@"`` — so any failing
step fails the Pod, the daemon replaces the shell (it gets the signals), and its arguments
reach it unquoted and intact. The handle is ``{"pod", "namespace", "secret"}``; terminate
deletes the Pod and then the Secret, an already missing one being fine.

Labels: ``request.labels()`` (launch id, Lakeshore namespace, scope) plus the config's
``extra_labels``. A value Kubernetes would refuse as a label (``pool:gpu``, or longer than
63 characters) is made label-safe and suffixed with a short hash of the exact value; the
exact values are always kept in annotations under the same keys.

Config: ``namespace`` (the Kubernetes namespace, default ``default``); how to reach the API
— ``kubeconfig`` (a path, with an optional ``context``), or ``in_cluster``, or ``host`` (an
API server URL used as is, with no credentials: emulators, ``kubectl proxy``); with none of
them the default kubeconfig (``KUBECONFIG``, ``~/.kube/config``) is loaded; ``verify_ssl``
(default true); ``image`` (used when ``daemonTemplate.image_id`` is unset; a launch with
neither fails); ``image_pull_policy``; ``service_account`` (without one the Pod gets no
Kubernetes API token); ``resources`` (``requests`` / ``limits`` for the container);
``extra_labels``; ``request_timeout_s`` (each API call; default 5); ``launch_ttl_s``
(default 120: images are pulled and Pods scheduled before the daemon says hello);
``boot_s`` (the boot time ``wait_target`` plans with until it has learned one; unset).

The client is blocking, so every call runs in a worker thread; it is built lazily, once
per provider instance, and ``kubernetes`` is imported only then (this module is imported at
server start). API errors, unreachable servers, missing or broken kubeconfigs and answers
that are not what was asked for all become a :class:`LaunchError` with a short message.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import threading
from collections.abc import Mapping
from typing import Any, Final

from lakeshore.providers import base
from lakeshore.providers.kube_manifests import (
    DNS_SUBDOMAIN_RE,
    KubeConfig,
    object_name,
    pod_manifest,
    secret_manifest,
)

MAX_MESSAGE: Final = 300
_ERRNO_RE: Final = re.compile(r"\[Errno -?\d+\] ([^'\")]+)")


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…"


def _api_error(exc: Any) -> str:
    """``Kubernetes API answered 403 Forbidden: <the Status message>``."""
    message = ""
    try:
        status = json.loads(exc.body or "")
        if isinstance(status, dict) and isinstance(status.get("message"), str):
            message = status["message"]
    except (TypeError, ValueError):
        message = ""
    head = f"Kubernetes API answered {exc.status} {exc.reason or ''}".rstrip()
    return _short(f"{head}: {message}" if message else head)


def _transport_error(exc: Exception, host: str) -> str:
    """Why the API could not be reached (refused, timed out, TLS, …)."""
    import urllib3.exceptions as u3

    cause: Any = exc.reason if isinstance(exc, u3.MaxRetryError) and exc.reason else exc
    # errno first: urllib3's NewConnectionError (refused, no route, …) is a ConnectTimeoutError
    if errno := _ERRNO_RE.search(str(cause)):
        why = errno.group(1).strip().lower()
    elif isinstance(cause, u3.TimeoutError | TimeoutError):
        why = "timed out"
    elif isinstance(cause, u3.SSLError):
        why = f"TLS error ({_short(str(cause))})"
    else:
        why = type(cause).__name__
    return f"cannot reach the Kubernetes API at {host}: {why}"


def describe(exc: Exception, host: str) -> str:
    """A short message for anything the client raised."""
    import urllib3.exceptions as u3
    from kubernetes.client.exceptions import ApiException

    if isinstance(exc, ApiException):
        return _api_error(exc)
    if isinstance(exc, u3.HTTPError | OSError):
        return _transport_error(exc, host)
    return f"unexpected answer from the Kubernetes API at {host} ({type(exc).__name__})"


def _is_not_found(exc: Exception) -> bool:
    from kubernetes.client.exceptions import ApiException

    return isinstance(exc, ApiException) and exc.status == 404


def _load_kubeconfig(config: KubeConfig, configuration: Any) -> None:
    from kubernetes import config as kube_config

    path = os.path.expanduser(config.kubeconfig) if config.kubeconfig else None
    if path is not None and not os.path.isfile(path):
        raise base.LaunchError(f"no kubeconfig at {path}")
    where = path or os.environ.get("KUBECONFIG") or "~/.kube/config"
    try:
        kube_config.load_kube_config(
            config_file=path,
            context=config.context,
            client_configuration=configuration,
            persist_config=False,  # never write refreshed credentials back to the file
        )
    except kube_config.ConfigException as exc:
        hint = "" if path else "; set kubeconfig, in_cluster or host in the provider config"
        raise base.LaunchError(_short(f"cannot load kubeconfig {where}: {exc}{hint}")) from exc
    except Exception as exc:
        message = f"cannot load kubeconfig {where}: not a valid kubeconfig ({type(exc).__name__})"
        raise base.LaunchError(message) from exc


def _load_in_cluster(configuration: Any) -> None:
    from kubernetes import config as kube_config

    try:
        kube_config.load_incluster_config(client_configuration=configuration)
    except Exception as exc:
        message = f"in_cluster is set but no in-cluster Kubernetes config was found: {exc}"
        raise base.LaunchError(_short(message)) from exc


def connect(config: KubeConfig) -> Any:
    """A ``CoreV1Api`` for ``config`` (blocking: reads kubeconfig files)."""
    from kubernetes import client

    configuration = client.Configuration()
    if config.host is not None:
        configuration.host = config.host
    elif config.in_cluster:
        _load_in_cluster(configuration)
    else:
        _load_kubeconfig(config, configuration)
    if not config.verify_ssl:
        configuration.verify_ssl = False
    configuration.retries = 0  # no silent retries: the next tick is the retry
    return client.CoreV1Api(client.ApiClient(configuration))


class KubeProvider:
    kind = "kube"

    def __init__(self, name: str, config: KubeConfig) -> None:
        self.name = name
        self.config = config
        self.launch_ttl_s = config.launch_ttl_s
        self._api: Any = None
        self._lock = threading.Lock()

    async def launch(self, request: base.LaunchRequest) -> dict[str, Any]:
        image = request.body.image_id or self.config.image
        if not image:
            raise base.LaunchError(
                f'provider "{self.name}" has no image to run: set daemonTemplate.image_id on '
                "the queue or image in the provider config"
            )
        name = object_name(request.launch_id)
        secret = secret_manifest(name, self.config, request) if request.token else None
        pod = pod_manifest(name, self.config, request, image, name if secret else None)
        attempt: base.Attempt[dict[str, Any]] = base.Attempt()
        try:
            return await asyncio.to_thread(self._launch, pod, secret, attempt)
        except asyncio.CancelledError:  # timed out: what the call still makes is deleted
            attempt.abandon(self._delete_quietly)
            raise

    def _delete_quietly(self, handle: dict[str, Any]) -> None:
        self._clean_up(handle["namespace"], handle["pod"], handle["secret"] is not None)

    async def terminate(self, handle: Mapping[str, Any], worker_id: str) -> None:
        pod, namespace, secret = _parse_handle(handle)
        await asyncio.to_thread(self._terminate, namespace, pod, secret)

    # --- blocking parts, in a worker thread --------------------------------------------

    def _core(self) -> Any:
        with self._lock:
            if self._api is None:
                self._api = connect(self.config)
            return self._api

    def _call(self, what: str, method: str, *args: Any, missing_ok: bool = False) -> Any:
        """``CoreV1Api.<method>(*args)``; any failure is a LaunchError starting with
        ``what``; with ``missing_ok`` a 404 answers None."""
        api = self._core()
        timeout = self.config.request_timeout_s
        try:
            return getattr(api, method)(*args, _request_timeout=(timeout, timeout))
        except Exception as exc:
            if missing_ok and _is_not_found(exc):
                return None
            host = api.api_client.configuration.host
            raise base.LaunchError(f"{what}: {describe(exc, host)}") from exc

    def _release(self) -> None:
        """Close idle connections: nothing stays open between the controller's calls."""
        if self._api is not None:
            self._api.api_client.rest_client.pool_manager.clear()

    def _launch(
        self,
        pod: dict[str, Any],
        secret: dict[str, Any] | None,
        attempt: base.Attempt[dict[str, Any]],
    ) -> dict[str, Any]:
        namespace = self.config.namespace
        name = pod["metadata"]["name"]
        self._core()  # a config problem fails here, before anything is created
        try:
            if secret is not None:
                where = f"creating secret {name} in namespace {namespace}"
                self._call(where, "create_namespaced_secret", namespace, secret)
            try:
                where = f"creating pod {name} in namespace {namespace}"
                created = self._call(where, "create_namespaced_pod", namespace, pod)
                if getattr(getattr(created, "metadata", None), "name", None) != name:
                    raise base.LaunchError(
                        f"{where}: the Kubernetes API answered with something that is not that pod"
                    )
            except base.LaunchError:
                self._clean_up(namespace, name, secret is not None)
                raise
            handle = {"pod": name, "namespace": namespace, "secret": name if secret else None}
            if not attempt.deliver(handle):
                self._clean_up(namespace, name, secret is not None)
                raise base.LaunchError(f"launch abandoned; pod {name} deleted")
        finally:
            self._release()
        return handle

    def _clean_up(self, namespace: str, name: str, secret: bool) -> None:
        """Best effort after a failed launch: no half-made Pod or token Secret is left."""
        kinds = ["pod", "secret"] if secret else ["pod"]
        for kind in kinds:
            with contextlib.suppress(base.LaunchError):
                self._delete(kind, namespace, name)

    def _delete(self, kind: str, namespace: str, name: str) -> None:
        """Delete one Pod or Secret; one that is already gone is fine."""
        where = f"deleting {kind} {name} in namespace {namespace}"
        self._call(where, f"delete_namespaced_{kind}", name, namespace, missing_ok=True)

    def _terminate(self, namespace: str, pod: str, secret: str | None) -> None:
        try:
            self._delete("pod", namespace, pod)
            if secret is not None:
                self._delete("secret", namespace, secret)
        finally:
            self._release()


def _parse_handle(handle: Mapping[str, Any]) -> tuple[str, str, str | None]:
    """The handle a launch returned: pod, namespace, secret (or None)."""
    if not isinstance(handle, Mapping):
        raise base.LaunchError(f"not a kube launch handle: {_short(repr(handle))}")
    pod, namespace, secret = handle.get("pod"), handle.get("namespace"), handle.get("secret")
    if (
        isinstance(pod, str)
        and isinstance(namespace, str)
        and (secret is None or isinstance(secret, str))
        and all(DNS_SUBDOMAIN_RE.fullmatch(v) for v in (pod, namespace, secret or pod))
    ):
        return pod, namespace, secret
    raise base.LaunchError(f"not a kube launch handle: {_short(repr(dict(handle)))}")


def install() -> None:
    # the server's own cluster credentials: only the admin may hand them to a namespace
    base.register(
        "kube",
        base.Kind(
            config=KubeConfig, factory=KubeProvider, admin_only=True, sdk="kubernetes", extra="kube"
        ),
    )
