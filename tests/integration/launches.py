"""Checks shared by the provider tests: what a failed launch must leave behind."""

from __future__ import annotations

from typing import Any

import httpx

NS = "/v1/namespaces/default"


async def assert_failed_and_released(
    api: httpx.AsyncClient, provider: str, queue: str, tokens: list[str]
) -> dict[str, Any]:
    """The queue's one launch through ``provider`` failed, its slot is free again and its
    token opens nothing."""
    response = await api.get(f"{NS}/providers/{provider}/launches")
    assert response.status_code == 200, response.text
    [launch] = response.json()["launches"]
    assert launch["state"] == "failed", launch
    assert launch["handle"] is None, launch
    stats = (await api.get(f"{NS}/queues/{queue}/stats")).json()
    assert stats["inFlight"] == 0, stats
    [token] = tokens
    refused = await api.get(f"{NS}/queues", headers={"Authorization": f"Bearer {token}"})
    assert refused.status_code == 401, refused.text
    return dict(launch)
