"""Rate limits per queue and per concurrency key, through the API (both stores): a
key's own bucket, a submit without a key paced by the queue's alone, a refused batch
that spends nothing, and the 429's Retry-After."""

from __future__ import annotations

import httpx

from tests.conftest import FakeClock
from tests.integration.test_api_workers import NS


async def post(api: httpx.AsyncClient, body: dict[str, object]) -> httpx.Response:
    return await api.post(f"{NS}/queues/keyed/invocations", json={"fn": "m:f", **body})


async def test_each_concurrency_key_has_a_bucket_of_its_own(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    admission = {"rate_limit_per_key": 2}
    made = await api.post(f"{NS}/queues", json={"name": "keyed", "admission": admission})
    assert made.status_code == 201, made.text
    for _ in range(2):  # a second's burst of key a
        assert (await post(api, {"concurrency_key": "a"})).status_code == 201
    refused = await post(api, {"concurrency_key": "a"})
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["field"] == "admission.rate_limit_per_key"
    assert 'concurrency key "a"' in refused.json()["error"]["message"]
    assert 0 < float(refused.headers["Retry-After"]) <= 1
    assert (await post(api, {"concurrency_key": "b"})).status_code == 201  # b's own
    for _ in range(5):  # no key: not paced by any key's bucket
        assert (await post(api, {})).status_code == 201
    clock.advance(0.5)  # half a second refills one token of a's
    assert (await post(api, {"concurrency_key": "a"})).status_code == 201
    assert (await post(api, {"concurrency_key": "a"})).status_code == 429


async def test_a_refused_batch_spends_no_token(api: httpx.AsyncClient, clock: FakeClock) -> None:
    admission = {"rate_limit": 4, "rate_limit_per_key": 1}
    made = await api.post(f"{NS}/queues", json={"name": "keyed", "admission": admission})
    assert made.status_code == 201, made.text
    assert (await post(api, {"concurrency_key": "x"})).status_code == 201  # x's token
    batch = {"invocations": [{"fn": "m:f"}, {"fn": "m:f", "concurrency_key": "x"}]}
    refused = await api.post(f"{NS}/queues/keyed/invocations/batch", json=batch)
    assert refused.status_code == 429, refused.text  # x has none left
    assert refused.json()["error"]["field"] == "admission.rate_limit_per_key"
    # the queue's token the batch took was given back with the refusal: three go in
    for key in ("y", None, None):
        answer = await post(api, {"concurrency_key": key} if key else {})
        assert answer.status_code == 201, answer.text
    assert (await post(api, {})).status_code == 429  # and the fifth of the second waits
    clock.advance(1)
    assert (await api.post(f"{NS}/queues/keyed/invocations/batch", json=batch)).is_success
