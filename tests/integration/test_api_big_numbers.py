"""Bodies the submit route does not read itself (api/lean.py) are refused with the
framework's words, on both stores: an integer of more digits than Python converts,
nesting deeper than the parser goes, a NaN. The first submit to a queue reads the queue,
the next ones are one statement (the queue is known by then), so each body is sent three
times."""

from __future__ import annotations

import httpx
import pytest

NS = "/v1/namespaces/default"


async def _known(api: httpx.AsyncClient, queue: str) -> None:
    """A first submit, which reads the queue: the next ones are one statement."""
    first = await api.post(f"{NS}/queues/{queue}/invocations", json={"fn": "m:f"})
    assert first.status_code == 201, first.text


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b'{"fn": "m:f", "args": [' + b"1" * 5000 + b"]}", 400, "error parsing the body"),
        (b'{"fn": "m:f", "args": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, "body"),
        (b'{"fn": "m:f", "args": [1, NaN]}', 422, "args[1]"),
    ],
    ids=["5000-digits", "100000-deep", "nan"],
)
async def test_a_body_the_route_does_not_read_is_refused_with_the_frameworks_words(
    api: httpx.AsyncClient, body: bytes, status: int, words: str
) -> None:
    await _known(api, "edges")
    for _ in range(3):
        answer = await api.post(
            f"{NS}/queues/edges/invocations",
            content=body,
            headers={"Content-Type": "application/json"},
        )
        assert answer.status_code == status, answer.text
        assert words in answer.json()["error"]["message"]
    listed = (await api.get(f"{NS}/queues/edges/invocations")).json()["invocations"]
    assert len(listed) == 1  # the first alone: nothing refused was written
