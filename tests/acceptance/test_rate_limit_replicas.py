"""A queue's rate limit holds across replicas: two servers on one PostgreSQL database,
each sent submits at 1.5x the limit (3x together) for ~12 s, admit together no more
than the limit allows (their buckets are one, in the store)."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta

from tests.acceptance.conftest import LakeshoreServer
from tests.acceptance.test_streaming_and_replicas import connect, replicas

__all__ = ["replicas"]  # the fixture, shared with the module it comes from

NS = "/v1/namespaces/default"
RATE = 20.0  # submits a second, for the queue as a whole
SEND_FOR_S = 12.5  # 2 s to drain the first second's burst, then the 10 s counted
WINDOW_S = 10.0


def send(url: str, token: str, every_s: float, admitted: list[str], refused: list[int]) -> None:
    """Submit at one per ``every_s`` for :data:`SEND_FOR_S` (the load, not a wait)."""
    with connect(url, token) as http:
        end = time.monotonic() + SEND_FOR_S
        while (now := time.monotonic()) < end:
            answer = http.post(f"{NS}/queues/paced/invocations", json={"fn": "m:f"})
            if answer.status_code == 201:
                admitted.append(answer.json()["created_at"])
            else:
                assert answer.status_code == 429, answer.text
                assert float(answer.headers["Retry-After"]) > 0
                refused.append(answer.status_code)
            time.sleep(max(0.0, every_s - (time.monotonic() - now)))


def test_two_replicas_admit_no_more_than_the_queue_s_rate_limit(
    replicas: tuple[LakeshoreServer, str],
) -> None:
    a, url_b = replicas
    with connect(a.url, a.admin_token) as http:
        made = http.post(f"{NS}/queues", json={"name": "paced", "admission": {"rate_limit": RATE}})
        assert made.status_code == 201, made.text
    admitted: list[str] = []
    refused: list[int] = []
    every_s = 1 / (1.5 * RATE)  # each replica 1.5x the limit: 3x together
    senders = [
        threading.Thread(target=send, args=(url, a.admin_token, every_s, admitted, refused))
        for url in (a.url, url_b)
    ]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join(60)
    times = sorted(datetime.fromisoformat(at) for at in admitted)
    assert times, "nothing was admitted"
    # from the first admitted after the burst has drained (the bucket is then empty),
    # the store's own times: at most one more than the rate over the window
    start = next(t for t in times if t >= times[0] + timedelta(seconds=2))
    counted = sum(1 for t in times if start <= t < start + timedelta(seconds=WINDOW_S))
    assert 0 < counted <= RATE * WINDOW_S * 1.01, (counted, len(admitted), len(refused))
    assert refused  # more than the rate was sent, and the rest was refused with a 429
