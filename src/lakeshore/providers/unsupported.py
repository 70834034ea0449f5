"""``ssh`` and ``slurm``: registrable, so a queue may name them, and refused at launch
with a clear reason (the reference pages list them; Lakeshore does not drive them)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from lakeshore.providers import base


class AnyConfig(BaseModel):
    model_config = ConfigDict(extra="allow")


class UnsupportedProvider:
    launch_ttl_s = base.DEFAULT_LAUNCH_TTL_S

    def __init__(self, name: str, kind: str) -> None:
        self.name = name
        self.kind = kind

    async def launch(self, request: base.LaunchRequest) -> dict[str, Any]:
        raise base.LaunchError(
            f'provider "{self.name}" is of kind {self.kind}, which Lakeshore registers but '
            "cannot launch on; use local, kube, ec2 or gce"
        )

    async def terminate(self, handle: Mapping[str, Any], worker_id: str) -> None:
        raise base.LaunchError(f"{self.kind} providers cannot terminate daemons")


def _factory(kind: str) -> Any:
    def make(name: str, _config: Any) -> UnsupportedProvider:
        return UnsupportedProvider(name, kind)

    return make


def install() -> None:
    for kind in ("ssh", "slurm"):
        base.register(kind, base.Kind(config=AnyConfig, factory=_factory(kind)))
