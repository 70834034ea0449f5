"""The queue list a page at a time (``limit``, ``cursor``, ``next_cursor``), on both stores."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

QUEUES = "/v1/namespaces/default/queues"


async def _create(api: httpx.AsyncClient, count: int, prefix: str = "q") -> list[str]:
    names = [f"{prefix}-{i:03d}" for i in range(count)]
    for name in names:
        response = await api.post(QUEUES, json={"name": name})
        assert response.status_code == 201, response.text
    return names


async def _pages(api: httpx.AsyncClient, **params: Any) -> list[list[str]]:
    """Every page's names, following next_cursor until it is null."""
    pages: list[list[str]] = []
    while True:
        response = await api.get(QUEUES, params=params)
        assert response.status_code == 200, response.text
        body = response.json()
        pages.append([q["name"] for q in body["queues"]])
        if body["next_cursor"] is None:
            return pages
        params = {**params, "cursor": body["next_cursor"]}


async def test_pages_of_limit_queues_give_every_queue_once_in_name_order(
    api: httpx.AsyncClient,
) -> None:
    names = await _create(api, 7)

    pages = await _pages(api, limit=3)

    assert [len(page) for page in pages] == [3, 3, 1]
    assert [name for page in pages for name in page] == names


async def test_a_page_that_ends_the_list_has_no_next_cursor(api: httpx.AsyncClient) -> None:
    await _create(api, 4)

    assert await _pages(api, limit=2) == [["q-000", "q-001"], ["q-002", "q-003"]]
    assert (await api.get(QUEUES, params={"limit": 4})).json()["next_cursor"] is None


async def test_the_list_is_paged_at_100_when_no_limit_is_given(api: httpx.AsyncClient) -> None:
    names = await _create(api, 101)

    first = (await api.get(QUEUES)).json()
    rest = (await api.get(QUEUES, params={"cursor": first["next_cursor"]})).json()

    assert [q["name"] for q in first["queues"]] == names[:100]
    assert [q["name"] for q in rest["queues"]] == names[100:]
    assert rest["next_cursor"] is None


async def test_archived_queues_are_paged_only_when_asked(api: httpx.AsyncClient) -> None:
    names = await _create(api, 5)
    for archived in ("q-001", "q-003"):
        assert (await api.post(f"{QUEUES}/{archived}/archive")).status_code == 200

    live = await _pages(api, limit=2)
    everything = await _pages(api, limit=2, include_archived="true")

    assert live == [["q-000", "q-002"], ["q-004"]]
    assert [name for page in everything for name in page] == names


async def test_a_queue_created_behind_the_cursor_does_not_shift_the_next_page(
    api: httpx.AsyncClient,
) -> None:
    await _create(api, 4, prefix="m")
    first = (await api.get(QUEUES, params={"limit": 2})).json()
    await _create(api, 1, prefix="a")  # sorts before every page so far

    second = (await api.get(QUEUES, params={"limit": 2, "cursor": first["next_cursor"]})).json()

    assert [q["name"] for q in second["queues"]] == ["m-002", "m-003"]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": 1001}, "limit"),
        ({"limit": "many"}, "limit"),
        ({"cursor": "Not A Name"}, "cursor"),
        ({"cursor": "x" * 201}, "cursor"),
    ],
)
async def test_a_limit_out_of_range_or_a_cursor_no_page_ended_with_is_422(
    api: httpx.AsyncClient, params: dict[str, Any], field: str
) -> None:
    response = await api.get(QUEUES, params=params)

    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == field
