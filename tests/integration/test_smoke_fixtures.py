from __future__ import annotations

import httpx


async def test_health_answers_on_each_backend(api: httpx.AsyncClient) -> None:
    response = await api.get("/healthz")
    assert response.status_code == 200
    assert response.json()["status"] == "ok"
