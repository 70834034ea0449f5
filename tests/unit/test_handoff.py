"""The claims waiting in a server, as a submit finds them (services/taskqueue/handoff.py)."""

from __future__ import annotations

from lakeshore.domain import access
from lakeshore.services.taskqueue.handoff import Waiter, Waiting
from lakeshore.services.taskqueue.notify import Hangup


def waiter(worker: str, gone: bool = False, token: str | None = None) -> Waiter:
    caller = None if token is None else access.Caller(False, "namespace", token, token)
    hung_up = Hangup()
    if gone:
        hung_up.set()
    return Waiter(worker, holds=4, caller=caller, lease_s=30.0, gone=hung_up)


async def test_the_longest_waiting_claim_is_taken_and_leaves_every_queue() -> None:
    room = Waiting()
    first, second = waiter("w1"), waiter("w2")
    with room.wait(first, ["a", "b"]), room.wait(second, ["a"]):
        assert (room.on("a"), room.on("b")) == (2, 1)
        assert room.take("a", "a", None) is first
        assert first.woken.is_set() and not second.woken.is_set()
        assert (room.on("a"), room.on("b")) == (1, 0)  # taken: waits for no one else
        assert room.take("b", "b", None) is None
        assert room.take("a", "a", None) is second
    assert (room.on("a"), room.on("b")) == (0, 0)


async def test_a_hung_up_claim_and_a_refused_token_are_passed_over() -> None:
    room = Waiting()
    gone, refused, fine = waiter("w1", gone=True), waiter("w2", token="ci"), waiter("w3")
    policy = {"claim": ["ops"]}
    with room.wait(gone, ["q"]), room.wait(refused, ["q"]), room.wait(fine, ["q"]):
        assert room.take("q", "q", policy) is fine
        assert room.take("q", "q", policy) is None
        assert room.take("q", "q", None) is refused  # no policy: any token may claim


async def test_a_taken_claim_receives_what_it_is_handed_once() -> None:
    room = Waiting()
    taken, untouched = waiter("w1"), waiter("w2")
    with room.wait(taken, ["q"]):
        assert room.take("q", "q", None) is taken
    Waiting.settle(taken, [{"id": "inv_1"}])
    Waiting.settle(taken, [])  # a second settle changes nothing
    assert await taken.received() == [{"id": "inv_1"}]
    assert await untouched.received() == []
