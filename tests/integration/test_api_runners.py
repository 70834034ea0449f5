"""A queue whose daemons Lakeshore launches names only runners a Lakeshore daemon has
(both stores): otherwise every launched daemon would exit at start and the controller
would launch again and again."""

from __future__ import annotations

import httpx
import pytest

from lakeshore.domain.runners import RUNNERS
from tests.integration.test_controller import NS, elastic, provider


@pytest.mark.parametrize(
    "template",
    [{"runners": ["docker"]}, {"runner": "docker"}, {"runners": ["process", "docker"]}],
    ids=["runners", "runner", "one-of-two"],
)
async def test_a_template_with_a_runner_the_daemon_lacks_is_refused(
    api: httpx.AsyncClient, template: dict[str, object]
) -> None:
    await provider(api)
    body = {"name": "gpu", "providerRef": "fk", "elasticity": elastic(max=2)}
    refused = await api.post(f"{NS}/queues", json={**body, "daemonTemplate": template})
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["field"] == "daemonTemplate.runners"
    assert "'docker'" in error["message"] and ", ".join(RUNNERS) in error["message"]
    assert (await api.get(f"{NS}/queues/gpu")).status_code == 404
    two = {"runners": ["process", "thread"]}
    refused = await api.post(f"{NS}/queues", json={**body, "daemonTemplate": two})
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["message"].startswith("a Lakeshore daemon runs with one")

    made = await api.post(f"{NS}/queues", json={**body, "daemonTemplate": {"runner": "thread"}})
    assert made.status_code == 201, made.text
    patched = await api.patch(f"{NS}/queues/gpu", json={"daemonTemplate": template})
    assert patched.status_code == 422, patched.text
    kept = (await api.get(f"{NS}/queues/gpu")).json()["daemonTemplate"]
    assert kept == {"runner": "thread"}


async def test_runner_names_without_a_provider_are_labels(api: httpx.AsyncClient) -> None:
    """No providerRef: Lakeshore launches nothing for the queue, so the names are only
    what bring-your-own daemons announce."""
    body = {"name": "byo", "daemonTemplate": {"runners": ["docker"]}}
    made = await api.post(f"{NS}/queues", json=body)
    assert made.status_code == 201, made.text
