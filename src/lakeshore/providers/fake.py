"""The ``fake`` provider: every launch and terminate is recorded (by the controller, in the
launches table) and nothing runs. For dry runs of a policy, and for tests.

Config: ``launch_ttl_s`` (how long a launch stays in flight without a hello; default
15), ``boot_s`` (the boot time ``wait_target`` plans with until it has learned one;
unset), and, to rehearse failures, ``fail_launch`` / ``fail_terminate`` (every call fails
with that message) and ``hang_s`` (every call first waits that long).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from lakeshore.providers import base


class FakeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    launch_ttl_s: Annotated[float, Field(gt=0, le=86_400)] = base.DEFAULT_LAUNCH_TTL_S
    boot_s: base.BootSeconds | None = None  # wait_target's boot time until it learns
    fail_launch: Annotated[str, Field(min_length=1, max_length=1024)] | None = None
    fail_terminate: Annotated[str, Field(min_length=1, max_length=1024)] | None = None
    hang_s: Annotated[float, Field(ge=0, le=3600)] = 0.0


class FakeProvider:
    kind = "fake"

    def __init__(self, name: str, config: FakeConfig) -> None:
        self.name = name
        self.config = config
        self.launch_ttl_s = config.launch_ttl_s

    async def launch(self, request: base.LaunchRequest) -> dict[str, Any]:
        await asyncio.sleep(self.config.hang_s)
        if self.config.fail_launch:
            raise base.LaunchError(self.config.fail_launch)
        return {"fake": request.launch_id}

    async def terminate(self, handle: Mapping[str, Any], worker_id: str) -> None:
        await asyncio.sleep(self.config.hang_s)
        if self.config.fail_terminate:
            raise base.LaunchError(self.config.fail_terminate)


def install() -> None:
    base.register("fake", base.Kind(config=FakeConfig, factory=FakeProvider))
