"""Submitting, reading, listing and cancelling invocations, on both stores."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest
from asgi_lifespan import LifespanManager
from sqlalchemy.exc import OperationalError

from lakeshore.api.app import create_app
from lakeshore.config import Settings
from lakeshore.services.taskqueue import invocations as inv_service
from lakeshore.store import engine as engine_module
from lakeshore.store import invocations as inv_store
from lakeshore.store import namespaces as ns_store
from lakeshore.store import statements as statements_module
from tests.conftest import ADMIN, FakeClock

NS = "/v1/namespaces/default"


def inv(queue: str) -> str:
    return f"{NS}/queues/{queue}/invocations"


async def submit(api: httpx.AsyncClient, queue: str = "work", **body: Any) -> dict[str, Any]:
    response = await api.post(inv(queue), json={"fn": "tests.udfs:echo", **body})
    assert response.status_code == 201, response.text
    return dict(response.json())


async def test_submitting_to_a_missing_queue_creates_it_as_fifo(api: httpx.AsyncClient) -> None:
    created = await submit(api, "fresh", args=[1, 2], kwargs={"x": "y"})
    assert created["state"] == "pending"
    assert (created["queue"], created["args"], created["kwargs"]) == ("fresh", [1, 2], {"x": "y"})
    assert (created["attempts"], created["max_attempts"]) == (0, 3)
    queue = (await api.get(f"{NS}/queues/fresh")).json()
    assert (queue["kind"], queue["state"]) == ("fifo", "active")
    assert (await api.get(f"{NS}/invocations/{created['id']}")).json() == created


async def test_a_submits_answer_is_what_a_read_returns(api: httpx.AsyncClient) -> None:
    # the answer is built from the rows the server wrote, not read back: every field,
    # integers past 64 bits, 1e23, -0.0, text past ASCII and a whole-number timeout_s
    # must come out as the store gives them
    body = {
        "fn": "tests.udfs:echo",
        "args": [10**30, 1e23, -0.0, "é ✓ 😀", {"deep": [None, True]}],
        "kwargs": {"priority": 2.5, "n": -(10**20)},
        "key": "k-exact",
        "max_attempts": 5,
        "timeout_s": 5,
    }
    one = await api.post(inv("exact"), json=body)
    assert one.status_code == 201, one.text
    batch = await api.post(
        f"{inv('exact')}/batch", json={"invocations": [{**body, "key": None}, body]}
    )
    assert batch.status_code == 201, batch.text
    assert batch.json()["created"] == [True, False]
    answers = [one.json(), *batch.json()["invocations"]]
    assert answers[0] == answers[2]  # the key's earlier invocation
    for answer in answers:
        assert (await api.get(f"{NS}/invocations/{answer['id']}")).json() == answer
        assert answer["timeout_s"] == 5.0 and isinstance(answer["timeout_s"], float)
        assert answer["args"][0] == 10**30


async def test_a_repeated_key_returns_the_first_invocation(api: httpx.AsyncClient) -> None:
    first = await submit(api, key="k-1")
    again = await api.post(inv("work"), json={"fn": "tests.udfs:other", "key": "k-1"})
    assert again.status_code == 200
    assert again.json()["id"] == first["id"]
    assert again.json()["fn"] == "tests.udfs:echo"


async def test_racing_submits_with_one_key_make_one_invocation(api: httpx.AsyncClient) -> None:
    await submit(api, "race")  # the queue exists; the race is on the key
    responses = await asyncio.gather(
        *(api.post(inv("race"), json={"fn": "m:f", "key": "same"}) for _ in range(20))
    )
    assert sorted(r.status_code for r in responses).count(201) == 1
    assert len({r.json()["id"] for r in responses}) == 1
    listed = (await api.get(inv("race"), params={"limit": 100})).json()["invocations"]
    assert len([i for i in listed if i["key"] == "same"]) == 1


async def test_the_same_key_in_two_queues_is_two_invocations(api: httpx.AsyncClient) -> None:
    a = await submit(api, "a", key="k")
    b = await submit(api, "b", key="k")
    assert a["id"] != b["id"]


async def test_a_batch_keeps_its_order_and_reports_what_was_new(api: httpx.AsyncClient) -> None:
    old = await submit(api, key="seen")
    items = [{"fn": "m:f", "args": [i]} for i in range(5)] + [{"fn": "m:f", "key": "seen"}]
    response = await api.post(f"{inv('work')}/batch", json={"invocations": items})
    assert response.status_code == 201
    body = response.json()
    assert [i["args"] for i in body["invocations"][:5]] == [[0], [1], [2], [3], [4]]
    assert body["created"] == [True] * 5 + [False]
    assert body["invocations"][5]["id"] == old["id"]


async def test_a_batch_answers_only_ids_when_asked(api: httpx.AsyncClient) -> None:
    old = await submit(api, key="seen-ids")
    items = [{"fn": "m:f", "args": [i]} for i in range(3)] + [{"fn": "m:f", "key": "seen-ids"}]
    response = await api.post(f"{inv('work')}/batch?answer=ids", json={"invocations": items})
    assert response.status_code == 201, response.text
    body = response.json()
    assert [set(i) for i in body["invocations"]] == [{"id"}] * 4
    assert body["invocations"][3]["id"] == old["id"]
    assert body["created"] == [True, True, True, False]
    stored = [
        (await api.get(f"/v1/namespaces/default/invocations/{i['id']}")).json()
        for i in body["invocations"][:3]
    ]
    assert [s["args"] for s in stored] == [[0], [1], [2]]
    wrong = await api.post(f"{inv('work')}/batch?answer=all", json={"invocations": items})
    assert wrong.status_code == 422
    assert "answer" in wrong.text


async def test_a_batch_body_is_read_as_pythons_json_reads_it(api: httpx.AsyncClient) -> None:
    # integers past 64 bits, exponents and text past ASCII keep their exact values (a
    # reader such as plain orjson would make 2**64 + 1 a float); NaN is refused where
    # it is, text that is not JSON as a whole
    raw = (
        b'{"invocations": [{"fn": "m:f", "args": [18446744073709551617, -9223372036854775809,'
        rb' 1e23, 2.5e-3, "\u00e9 \u2713", "\ud83d\ude00", {"k": [1, null]}]}]}'
    )
    json_header = {"content-type": "application/json"}
    response = await api.post(f"{inv('work')}/batch", content=raw, headers=json_header)
    assert response.status_code == 201, response.text
    stored = (await api.get(f"{NS}/invocations/{response.json()['invocations'][0]['id']}")).json()
    assert stored["args"] == json.loads(raw)["invocations"][0]["args"]
    assert [type(a) for a in stored["args"][:3]] == [int, int, float]
    nan = b'{"invocations": [{"fn": "m:f", "args": [NaN]}]}'
    refused = await api.post(f"{inv('work')}/batch", content=nan, headers=json_header)
    assert refused.status_code == 422
    assert refused.json()["error"]["field"].endswith("args[0]")
    broken = await api.post(
        f"{inv('work')}/batch", content=b'{"invocations": [', headers=json_header
    )
    assert broken.status_code == 400
    assert "JSON" in broken.json()["error"]["message"]


async def test_a_key_twice_in_one_batch_is_one_invocation_created_once(
    api: httpx.AsyncClient,
) -> None:
    items = [{"fn": "m:f", "key": "twin", "args": [n]} for n in (1, 2)]
    response = await api.post(f"{inv('work')}/batch", json={"invocations": items})
    assert response.status_code == 201, response.text
    body = response.json()
    first, second = body["invocations"]
    assert first["id"] == second["id"] and first["args"] == [1]
    assert body["created"] == [True, False]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"fn": "no colon"}, "fn"),
        ({}, "fn"),
        ({"fn": "m:f", "args": {"a": 1}}, "args"),
        ({"fn": "m:f", "kwargs": [1]}, "kwargs"),
        ({"fn": "m:f", "max_attempts": 0}, "max_attempts"),
        ({"fn": "m:f", "timeout_s": -1}, "timeout_s"),
        ({"fn": "m:f", "extra": 1}, "extra"),
    ],
)
async def test_bad_submits_are_422_naming_the_field(
    api: httpx.AsyncClient, body: dict[str, Any], field: str
) -> None:
    response = await api.post(inv("work"), json=body)
    assert response.status_code == 422
    assert response.json()["error"]["field"] == field


async def test_nan_in_arguments_is_422(api: httpx.AsyncClient) -> None:
    raw = b'{"fn": "m:f", "args": [NaN]}'
    response = await api.post(
        inv("work"), content=raw, headers={"content-type": "application/json"}
    )
    assert response.status_code == 422
    assert response.json()["error"]["field"] == "args[0]"


async def test_a_bad_batch_stores_nothing(api: httpx.AsyncClient) -> None:
    items = [{"fn": "m:f"}, {"fn": "bad"}]
    response = await api.post(f"{inv('work')}/batch", json={"invocations": items})
    assert response.status_code == 422
    assert response.json()["error"]["field"] == "invocations[1].fn"
    assert (await api.get(f"{NS}/queues/work")).status_code == 404


async def test_a_draining_queue_refuses_submits_and_a_paused_one_accepts(
    api: httpx.AsyncClient,
) -> None:
    await submit(api, "d")
    await submit(api, "p")
    await api.post(f"{NS}/queues/d/drain")
    await api.post(f"{NS}/queues/p/pause")
    assert (await api.post(inv("d"), json={"fn": "m:f"})).status_code == 409
    assert (await api.post(inv("p"), json={"fn": "m:f"})).status_code == 201


async def test_list_filters_by_state_and_pages_newest_first(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    ids = []
    for i in range(5):
        ids.append((await submit(api, args=[i]))["id"])
        clock.advance(1)
    cancelled = ids[0]
    await api.post(f"{NS}/invocations/{cancelled}/cancel")
    page1 = (await api.get(inv("work"), params={"limit": 2, "state": "pending"})).json()
    assert [i["id"] for i in page1["invocations"]] == [ids[4], ids[3]]
    page2 = (
        await api.get(
            inv("work"), params={"limit": 2, "state": "pending", "cursor": page1["next_cursor"]}
        )
    ).json()
    assert [i["id"] for i in page2["invocations"]] == [ids[2], ids[1]]
    only_cancelled = (await api.get(inv("work"), params={"state": "cancelled"})).json()
    assert [i["id"] for i in only_cancelled["invocations"]] == [cancelled]
    bad = await api.get(inv("work"), params={"cursor": "nonsense"})
    assert bad.status_code == 422


async def test_cancel_is_final_and_idempotent(api: httpx.AsyncClient) -> None:
    created = await submit(api)
    url = f"{NS}/invocations/{created['id']}/cancel"
    first, again = await api.post(url), await api.post(url)
    assert first.json()["state"] == again.json()["state"] == "cancelled"
    assert (await api.post(f"{NS}/invocations/inv_nope/cancel")).status_code == 404


async def test_another_namespaces_invocation_is_404(api: httpx.AsyncClient) -> None:
    created = await submit(api)
    await api.post("/v1/namespaces", json={"name": "team-b"})
    token = (await api.post("/v1/namespaces/team-b/tokens", json={})).json()["token"]
    other = {"Authorization": f"Bearer {token}"}
    assert (await api.get(f"{NS}/invocations/{created['id']}", headers=other)).status_code == 404
    foreign = f"/v1/namespaces/team-b/invocations/{created['id']}"
    assert (await api.get(foreign, headers=other)).status_code == 404
    assert (await api.post(f"{foreign}/cancel", headers=other)).status_code == 404
    assert (await api.get(f"{NS}/invocations/{created['id']}")).json()["state"] == "pending"


async def test_stats_count_submitted_work(api: httpx.AsyncClient) -> None:
    for _ in range(3):
        await submit(api)
    stats = (await api.get(f"{NS}/queues/work/stats")).json()
    assert (stats["pending"], stats["running"]) == (3, 0)


async def test_a_single_submit_to_a_known_queue_is_one_statement_that_sees_every_change(
    api: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A submit to a queue an earlier submit read is decided on that copy, in one
    statement that goes in only while the queue is still at the copy's revision. Each
    change of the queue (its authPolicy, admission, state) is seen by the next submit,
    which then goes the full way and answers with the current spec's reason."""
    taken: list[bool] = []
    real = inv_store.insert_at

    async def spy(*args: Any) -> Any:
        stored = await real(*args)
        taken.append(stored is not None)
        return stored

    monkeypatch.setattr(inv_store, "insert_at", spy)
    issued = await api.post(f"{NS}/tokens", json={"name": "ci"})
    ci = {"Authorization": f"Bearer {issued.json()['token']}"}
    first = await api.post(inv("known"), json={"fn": "m:f"}, headers=ci)  # reads the queue
    second = await api.post(inv("known"), json={"fn": "m:f", "key": "k"}, headers=ci)
    assert (first.status_code, second.status_code, taken) == (201, 201, [True])
    again = await api.post(inv("known"), json={"fn": "m:g", "key": "k"}, headers=ci)
    assert (again.status_code, again.json()["id"]) == (200, second.json()["id"])
    assert taken == [True, False]  # a taken key: the full path answers with its holder

    await submit(api, "known")  # the full path read it again: known once more
    patched = await api.patch(f"{NS}/queues/known", json={"authPolicy": {"submit": ["ops"]}})
    assert patched.status_code == 200, patched.text
    refused = await api.post(inv("known"), json={"fn": "m:f"}, headers=ci)
    assert refused.status_code == 403
    assert 'authPolicy.submit does not list token "ci"' in refused.json()["error"]["message"]
    assert taken[-1] is False  # the copy was stale: nothing went in

    patched = await api.patch(
        f"{NS}/queues/known", json={"authPolicy": None, "admission": {"max_depth": 3}}
    )
    assert patched.status_code == 200, patched.text
    assert (await api.post(inv("known"), json={"fn": "m:f"})).status_code == 429
    await api.post(f"{NS}/queues/known/drain")
    assert (await api.post(inv("known"), json={"fn": "m:f"})).status_code == 409
    stats = (await api.get(f"{NS}/queues/known/stats")).json()
    assert stats["pending"] == 3


async def test_a_batch_to_a_known_queue_is_one_statement_unless_keys_or_delays_need_more(
    api: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch without keys whose submits fall due together goes in as one statement on
    the copy of its queue an earlier submit read, in order, answered as the full path
    answers; a batch with a key, or submits due at different times, goes the full way
    (a taken key is read back there); a changed queue is seen by the next batch."""
    taken: list[int] = []
    real = inv_store.insert_at

    async def spy(*args: Any) -> Any:
        stored = await real(*args)
        taken.append(0 if stored is None else len(stored))
        return stored

    monkeypatch.setattr(inv_store, "insert_at", spy)
    batch = f"{inv('lot')}/batch"
    items = [{"fn": "m:f", "args": [n]} for n in range(3)]
    first = await api.post(batch, json={"invocations": items})  # reads the queue
    second = await api.post(batch, json={"invocations": items})
    assert (first.status_code, second.status_code, taken) == (201, 201, [3])
    ids = [invocation["id"] for invocation in second.json()["invocations"]]
    read = [(await api.get(f"{NS}/invocations/{i}")).json() for i in ids]
    assert [(r["args"], r["state"]) for r in read] == [([n], "pending") for n in range(3)]
    assert second.json()["invocations"] == read
    only_ids = await api.post(f"{batch}?answer=ids", json={"invocations": items})
    assert only_ids.json()["invocations"] == [
        {"id": i["id"]} for i in only_ids.json()["invocations"]
    ]
    assert taken == [3, 3]

    keyed = [{**items[0], "key": "k"}, items[1]]
    made = await api.post(batch, json={"invocations": keyed})
    again = await api.post(batch, json={"invocations": keyed})
    assert (made.status_code, again.status_code) == (201, 201)
    held = [i["id"] for i in made.json()["invocations"]]
    assert again.json()["invocations"][0]["id"] == held[0]  # the key's holder, read back
    assert again.json()["invocations"][1]["id"] not in held
    delayed = [{**items[0], "delay_s": 60}, items[1]]
    assert (await api.post(batch, json={"invocations": delayed})).status_code == 201
    assert taken == [3, 3]  # neither went in as one statement

    await api.post(batch, json={"invocations": items})
    assert taken == [3, 3, 3]
    patched = await api.patch(f"{NS}/queues/lot", json={"admission": {"max_depth": 1}})
    assert patched.status_code == 200, patched.text
    assert (await api.post(batch, json={"invocations": items})).status_code == 429
    assert taken == [3, 3, 3, 0]  # the stale copy put nothing in; the full path refused


async def test_every_single_submit_goes_through_the_route_and_answers_what_a_read_returns(
    api: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first submit to a queue, the next ones (decided on the queue the first read)
    and one whose body is of undeclared length (chunked, read whole) all go through the
    route and the one service entry, and answer with what a read of them returns."""
    routed: list[int] = []
    real = inv_service.submit_many

    async def spy(*args: Any, **kwargs: Any) -> Any:
        routed.append(len(args[4]))  # the bodies
        return await real(*args, **kwargs)

    monkeypatch.setattr(inv_service, "submit_many", spy)
    await submit(api, "warm")
    answers = [await submit(api, "warm", args=[n], kwargs={"n": n}) for n in range(3)]

    async def pieces() -> AsyncIterator[bytes]:
        for piece in (b'{"fn": "tests.udfs:echo", ', b'"args": ["in pieces"]', b"}"):
            yield piece

    pieced = await api.post(
        inv("warm"), content=pieces(), headers={"Content-Type": "application/json"}
    )
    assert pieced.status_code == 201, pieced.text
    assert pieced.json()["args"] == ["in pieces"]
    assert routed == [1, 1, 1, 1, 1]
    for answer in [*answers, pieced.json()]:
        assert (await api.get(f"{NS}/invocations/{answer['id']}")).json() == answer


@pytest.mark.parametrize(
    ("body", "headers", "status", "words"),
    [
        (b'{"fn": "m:f"', {}, 400, "request body is not valid JSON"),
        (b'[{"fn": "m:f"}]', {}, 422, "an invocation is a JSON object"),
        (b'{"fn": "no colon"}', {}, 422, "fn"),
        (b'{"fn": "m:f", "max_attempts": 0}', {}, 422, "max_attempts"),
        (b'{"fn": "m:f"}', {"Authorization": "Bearer nope"}, 401, "invalid or missing token"),
    ],
)
async def test_what_cannot_succeed_at_once_is_refused_by_the_route_with_its_body(
    api: httpx.AsyncClient, body: bytes, headers: dict[str, str], status: int, words: str
) -> None:
    """A request the route does not read itself (api/lean.py) is read by the framework,
    sent in pieces or not, and gets its refusal; nothing is stored."""
    await submit(api, "warm")  # known: a good submit would be one statement

    async def pieces() -> AsyncIterator[bytes]:
        yield body[:5]
        yield body[5:]

    for content in (body, pieces()):
        sent = {"Content-Type": "application/json", **headers}
        refused = await api.post(inv("warm"), content=content, headers=sent)
        assert refused.status_code == status, refused.text
        assert words in refused.json()["error"]["message"]
    stats = (await api.get(f"{NS}/queues/warm/stats")).json()
    assert stats["pending"] == 1


async def test_a_store_that_fails_under_a_one_statement_submit_is_a_503(
    api: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    await submit(api, "warm")

    async def down(*_: Any) -> Any:
        raise OperationalError("INSERT", {}, Exception("server closed the connection"))

    monkeypatch.setattr(inv_store, "insert_at", down)
    answer = await api.post(inv("warm"), json={"fn": "m:f"})
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["code"] == "store_unavailable"


@pytest.mark.parametrize(
    ("headers", "body", "status", "code"),
    [
        ({}, b'{"fn": "m:f", "args": ["' + b"x" * (1 << 20) + b'"]}', 413, "payload_too_large"),
        ({"Content-Length": "12x"}, b'{"fn": "m:f"}', 400, "bad_request"),
        ({"Last-Event-ID": "a\x00"}, b'{"fn": "m:f"}', 422, "invalid"),
    ],
)
async def test_the_middleware_refuses_a_submit_to_a_known_queue_as_any_request(
    api: httpx.AsyncClient, headers: dict[str, str], body: bytes, status: int, code: str
) -> None:
    """A submit to a known queue crosses the middleware, which refuses what it refuses
    of every request: a declared length over the body cap, a length that is not one, a
    read header that is not text."""
    await submit(api, "warm")
    sent = {"Content-Type": "application/json", **headers}
    refused = await api.post(inv("warm"), content=body, headers=sent)
    assert refused.status_code == status, refused.text
    assert refused.json()["error"]["code"] == code
    assert (await api.get(f"{NS}/queues/warm/stats")).json()["pending"] == 1


async def test_an_unexpected_error_under_a_one_statement_submit_is_a_counted_500(
    settings: Settings,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Answered by the framework's handler of the unexpected, as on any route (which
    then raises the error on to the server, to log: here it is not raised)."""
    app = create_app(settings, clock=clock)
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app, raise_app_exceptions=False)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://t", headers=ADMIN
        ) as api:
            await _an_unexpected_error_is_a_counted_500(api, monkeypatch, caplog)


async def _an_unexpected_error_is_a_counted_500(
    api: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    await submit(api, "warm")

    async def broken(*_: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(inv_store, "insert_at", broken)
    answer = await api.post(inv("warm"), json={"fn": "m:f"})
    assert answer.status_code == 500, answer.text
    assert answer.json()["error"] == {
        "code": "internal_error",
        "message": "internal error; the server log has details",
    }
    assert "a bug" not in answer.text
    assert any(r.exc_info and "a bug" in str(r.exc_info[1]) for r in caplog.records)
    metrics = (await api.get("/metrics")).text
    assert (
        'lakeshore_http_requests_total{method="POST",'
        'route="/v1/namespaces/{ns}/queues/{name}/invocations",status="500"} 1.0'
    ) in metrics
    assert 'route="(unmatched)"' not in metrics


async def test_a_statement_connection_the_database_refuses_is_a_503_at_once(
    api: httpx.AsyncClient, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL: a single submit's statement runs on a connection of its own
    (store/statements.py); when the database refuses a new one, the submit is refused
    at once, as any request the store cannot serve, and nothing is stored."""
    if database_url.startswith("sqlite"):
        pytest.skip("SQLite's one-statement write is a write transaction of its pool")
    await submit(api, "warm")  # the route, on SQLAlchemy's pool; the queue is now known
    connected: list[str] = []

    async def refused(conninfo: str) -> Any:
        connected.append(conninfo)
        raise psycopg.OperationalError("connection refused")

    monkeypatch.setattr(statements_module, "connect", refused)
    answer = await api.post(inv("warm"), json={"fn": "m:f"})
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["code"] == "store_unavailable"
    assert len(connected) == 1
    monkeypatch.undo()
    stats = (await api.get(f"{NS}/queues/warm/stats")).json()
    assert stats["pending"] == 1


async def test_a_sqlite_store_busy_past_its_wait_is_a_503_under_a_one_statement_submit(
    settings: Settings, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite: a single submit's write waits for this process's other writers up to
    WRITE_WAIT_S; past it, the answer is the 503 every request gets, not a 500."""
    if not settings.resolved_database_url.startswith("sqlite"):
        pytest.skip("SQLite's writer lock")
    app = create_app(settings, clock=clock)
    async with LifespanManager(app) as manager:
        store = app.state.lakeshore.store
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://t", headers=ADMIN
        ) as api:
            await submit(api, "warm")  # known: the next one is one statement
            monkeypatch.setattr(engine_module, "WRITE_WAIT_S", 0.05)
            async with store._one_writer():  # another writer holds the database
                answer = await api.post(inv("warm"), json={"fn": "m:f"})
            assert answer.status_code == 503, answer.text
            assert answer.json()["error"]["code"] == "store_unavailable"
            stats = (await api.get(f"{NS}/queues/warm/stats")).json()
            assert stats["pending"] == 1


async def test_a_store_that_fails_before_a_one_statement_submits_write_is_a_503(
    api: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A token not remembered yet is read from the store: when that read fails, the
    answer is the route's 503, as for any request."""
    await submit(api, "warm")
    issued = (await api.post(f"{NS}/tokens", json={"name": "late"})).json()["token"]

    async def down(*_: Any) -> Any:
        raise OperationalError("SELECT", {}, Exception("server closed the connection"))

    monkeypatch.setattr(ns_store, "get_token", down)
    answer = await api.post(
        inv("warm"), json={"fn": "m:f"}, headers={"Authorization": f"Bearer {issued}"}
    )
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["code"] == "store_unavailable"
