"""Providers: where launched daemons run (local processes, Kubernetes, EC2, GCE, …).

A provider is registered per namespace as ``{name, kind, config}``; :func:`build` turns a
registration into a :class:`~lakeshore.providers.base.Provider` the controller calls.
"""

from lakeshore.providers.base import (
    KINDS,
    LaunchError,
    LaunchRequest,
    Provider,
    build,
    parse_config,
)

__all__ = ["KINDS", "LaunchError", "LaunchRequest", "Provider", "build", "parse_config"]
