"""Wrong tokens and failed sign-ins, throttled per client address (both stores).

Each client below is the in-process app reached from an address of its own (the ASGI
scope's client, as uvicorn gives it); the app's clock is the test's, so a bucket drains
only when the test moves it.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager

import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI

from lakeshore.api.app import create_app
from lakeshore.config import Settings
from lakeshore.services.throttle import BURST, REFILL_S
from tests.conftest import ADMIN, ADMIN_TOKEN, FakeClock

QUEUES = "/v1/namespaces/default/queues"
WRONG = {"Authorization": "Bearer lks_0123456789abcdef_not-a-secret-we-issued"}
ATTACKER = "203.0.113.7"
NEIGHBOUR = "198.51.100.20"

Reach = Callable[..., AbstractAsyncContextManager[httpx.AsyncClient]]


@pytest.fixture
async def app(settings: Settings, clock: FakeClock) -> AsyncIterator[FastAPI]:
    made = create_app(settings, clock=clock)
    async with LifespanManager(made):
        yield made


@pytest.fixture
def reach(app: FastAPI) -> Reach:
    """A client of the app from ``host``, sending ``headers`` with each request."""

    def client(host: str, headers: dict[str, str] | None = None) -> httpx.AsyncClient:
        transport = httpx.ASGITransport(app=app, client=(host, 40000))
        return httpx.AsyncClient(
            transport=transport, base_url="http://lakeshore.test", headers=headers or {}
        )

    return client


async def namespace_token(reach: Reach) -> dict[str, str]:
    async with reach(NEIGHBOUR, ADMIN) as admin:
        issued = await admin.post("/v1/namespaces/default/tokens", json={"name": "t"})
    assert issued.status_code == 201, issued.text
    return {"Authorization": f"Bearer {issued.json()['token']}"}


async def burst_of_wrong_tokens(client: httpx.AsyncClient) -> None:
    for _ in range(BURST):
        assert (await client.get(QUEUES, headers=WRONG)).status_code == 401


def assert_throttled(answer: httpx.Response) -> None:
    assert answer.status_code == 429, answer.text
    assert answer.json()["error"]["code"] == "too_many_requests"
    assert 1 <= int(answer.headers["retry-after"]) <= REFILL_S


async def test_a_burst_of_wrong_tokens_from_one_address_is_answered_429(reach: Reach) -> None:
    async with reach(ATTACKER) as attacker:
        await burst_of_wrong_tokens(attacker)
        assert_throttled(await attacker.get(QUEUES, headers=WRONG))
        assert_throttled(await attacker.get(QUEUES, headers={"Authorization": "Bearer junk"}))
        assert_throttled(await attacker.post(QUEUES, json={"name": "q"}, headers=WRONG))


async def test_another_addresss_requests_are_untouched_by_a_throttled_one(reach: Reach) -> None:
    async with reach(ATTACKER) as attacker, reach(NEIGHBOUR) as neighbour:
        await burst_of_wrong_tokens(attacker)
        assert_throttled(await attacker.get(QUEUES, headers=WRONG))

        assert (await neighbour.get(QUEUES, headers=ADMIN)).status_code == 200
        # and its own mistakes are its own: 401, not 429
        assert (await neighbour.get(QUEUES, headers=WRONG)).status_code == 401


async def test_a_throttled_address_gets_one_more_try_every_refill(
    reach: Reach, clock: FakeClock
) -> None:
    async with reach(ATTACKER) as attacker:
        await burst_of_wrong_tokens(attacker)
        refused = await attacker.get(QUEUES, headers=WRONG)
        assert_throttled(refused)

        clock.advance(int(refused.headers["retry-after"]))
        assert (await attacker.get(QUEUES, headers=WRONG)).status_code == 401
        assert_throttled(await attacker.get(QUEUES, headers=WRONG))
        clock.advance(BURST * REFILL_S)  # drained: a new burst
        await burst_of_wrong_tokens(attacker)


async def test_requests_without_a_token_are_not_counted(reach: Reach) -> None:
    async with reach(ATTACKER) as anonymous:
        for _ in range(BURST * 2):
            assert (await anonymous.get(QUEUES)).status_code == 401


async def test_a_namespace_token_from_a_throttled_address_is_still_accepted(
    reach: Reach,
) -> None:
    valid = await namespace_token(reach)  # never used from the attacker's address before
    async with reach(ATTACKER) as shared:
        await burst_of_wrong_tokens(shared)
        assert_throttled(await shared.get(QUEUES, headers=WRONG))

        assert (await shared.get(QUEUES, headers=valid)).status_code == 200
        created = await shared.post(QUEUES, json={"name": "mine"}, headers=valid)
        assert created.status_code == 201, created.text


async def test_the_admin_token_from_a_throttled_address_waits_unless_it_came_from_there(
    reach: Reach,
) -> None:
    async with reach(ATTACKER) as attacker, reach("192.0.2.5") as operator:
        assert (await operator.get(QUEUES, headers=ADMIN)).status_code == 200
        for client in (attacker, operator):
            await burst_of_wrong_tokens(client)
            assert_throttled(await client.get(QUEUES, headers=WRONG))

        # answered as a wrong token is: the throttle is no oracle for guessing it
        assert_throttled(await attacker.get(QUEUES, headers=ADMIN))
        # accepted from where it was accepted before the address was throttled
        assert (await operator.get(QUEUES, headers=ADMIN)).status_code == 200


async def test_a_submit_to_a_known_queue_counts_and_refuses_wrong_tokens_as_any_route(
    reach: Reach,
) -> None:
    submit = f"{QUEUES}/jobs/invocations"
    async with reach(NEIGHBOUR, ADMIN) as neighbour, reach(ATTACKER) as attacker:
        assert (await neighbour.post(QUEUES, json={"name": "jobs"})).status_code == 201
        for _ in range(2):  # the second is one statement (the queue is known)
            assert (await neighbour.post(submit, json={"fn": "m:f"})).status_code == 201
        for _ in range(BURST):
            assert (
                await attacker.post(submit, json={"fn": "m:f"}, headers=WRONG)
            ).status_code == 401
        assert_throttled(await attacker.post(submit, json={"fn": "m:f"}, headers=WRONG))
        assert_throttled(await attacker.post(submit, json={"fn": "m:f"}, headers=ADMIN))

        assert (await neighbour.post(submit, json={"fn": "m:f"})).status_code == 201
        listed = await neighbour.get(f"{QUEUES}/jobs/invocations")
        assert len(listed.json()["invocations"]) == 3


async def sign_in(client: httpx.AsyncClient, token: str) -> httpx.Response:
    form = await client.get("/ui/login")
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', form.text)
    assert found, form.text
    return await client.post("/ui/login", data={"token": token, "csrf": found.group(1)})


async def test_a_burst_of_failed_sign_ins_is_answered_429_and_another_address_signs_in(
    reach: Reach,
) -> None:
    async with reach(ATTACKER) as attacker, reach(NEIGHBOUR) as neighbour:
        for _ in range(BURST):
            assert (await sign_in(attacker, "lks_0123456789abcdef_wrong")).status_code == 401
        refused = await sign_in(attacker, "lks_0123456789abcdef_wrong")
        assert refused.status_code == 429
        assert 1 <= int(refused.headers["retry-after"]) <= REFILL_S
        assert 'role="alert"' in refused.text
        assert "lakeshore_session" not in refused.headers.get("set-cookie", "")
        # the admin token, never accepted from there, waits as a wrong one does
        assert (await sign_in(attacker, ADMIN_TOKEN)).status_code == 429

        signed = await sign_in(neighbour, ADMIN_TOKEN)
        assert signed.status_code == 303
        assert (await neighbour.get(signed.headers["location"])).status_code == 200


async def test_sign_ins_and_api_calls_share_an_addresss_count(reach: Reach) -> None:
    async with reach(ATTACKER) as attacker:
        await burst_of_wrong_tokens(attacker)
        assert (await sign_in(attacker, "lks_0123456789abcdef_wrong")).status_code == 429
