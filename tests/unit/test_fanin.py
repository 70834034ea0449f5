"""Fan-in over handles (lakeshore/fanin.py), given a client whose invocations end as
told: results in order, the first error in order, timeouts, and wait's two modes."""

from __future__ import annotations

from typing import Any

import pytest

from lakeshore.fanin import FIRST_COMPLETED, gather, wait
from lakeshore.sdk import Handle, RemoteError


class Ends:
    """A client whose invocations have ended as given (None: still running)."""

    def __init__(self, ended: dict[str, dict[str, Any] | None]) -> None:
        self.ended_as = ended
        self.waited: list[tuple[str, float | None]] = []

    def ended(self, invocation_id: str, timeout: float | None = None) -> dict[str, Any]:
        self.waited.append((invocation_id, timeout))
        info = self.ended_as[invocation_id]
        if info is None:
            raise TimeoutError(invocation_id)
        return info

    def get(self, invocation_id: str) -> dict[str, Any]:
        return self.ended_as[invocation_id] or {"id": invocation_id, "state": "running"}


def ok(i: str, result: Any) -> dict[str, Any]:
    return {"id": i, "state": "succeeded", "result": result}


def failed(i: str, kind: str) -> dict[str, Any]:
    return {"id": i, "state": "failed", "error": {"type": kind, "message": "no"}}


def handles(client: Ends) -> list[Handle[Any]]:
    return [Handle(client, i) for i in client.ended_as]  # type: ignore[arg-type]


def test_gather_returns_results_in_order_and_raises_the_first_error_in_order() -> None:
    client = Ends({"a": ok("a", 1), "b": failed("b", "KeyError"), "c": failed("c", "Odd")})
    with pytest.raises(KeyError):
        gather(handles(client))
    assert [i for i, _ in client.waited] == ["a", "b"]  # it stopped at the first error
    got = gather(handles(client), return_exceptions=True)
    assert got[0] == 1 and isinstance(got[1], KeyError) and isinstance(got[2], RemoteError)
    assert gather(handles(Ends({"x": ok("x", None), "y": ok("y", [2])}))) == [None, [2]]


def test_gather_shares_one_deadline_between_the_waits() -> None:
    client = Ends({"a": ok("a", 1), "b": None})
    with pytest.raises(TimeoutError):
        gather(handles(client), timeout=30)
    (_, first), (_, second) = client.waited
    assert first is not None and second is not None and 0 <= second <= first <= 30


def test_wait_all_splits_at_the_first_not_ended() -> None:
    client = Ends({"a": ok("a", 1), "b": None, "c": ok("c", 3)})
    done, pending = wait(handles(client), timeout=1)
    assert ([h.id for h in done], [h.id for h in pending]) == (["a"], ["b", "c"])
    done, pending = wait(handles(Ends({"a": ok("a", 1), "b": failed("b", "E")})))
    assert ([h.id for h in done], pending) == (["a", "b"], [])  # a failure is ended too


def test_wait_first_completed_returns_every_ended_one() -> None:
    client = Ends({"a": None, "b": ok("b", 2), "c": failed("c", "E")})
    done, pending = wait(handles(client), return_when=FIRST_COMPLETED)
    assert ([h.id for h in done], [h.id for h in pending]) == (["b", "c"], ["a"])
    with pytest.raises(ValueError, match="return_when"):
        wait(handles(client), return_when="SOMETIMES")  # type: ignore[arg-type]
