"""The CLI's HTTP client: one place that turns refusals into messages, not tracebacks."""

from __future__ import annotations

from typing import Any

import httpx


class CliError(Exception):
    """A failure to show the user as one line, then exit non-zero."""


class ApiClient:
    def __init__(self, server: str, token: str | None, *, timeout: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.server = server.rstrip("/")
        self._http = httpx.Client(base_url=self.server, headers=headers, timeout=timeout)

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
    ) -> Any:
        try:
            response = self._http.request(method, path, json=json, params=params)
        except httpx.ConnectError as exc:
            raise CliError(
                f"cannot reach the Lakeshore server at {self.server} ({exc}); "
                "is `lakeshore server` running? (--server / LAKESHORE_URL)"
            ) from exc
        except httpx.HTTPError as exc:
            raise CliError(f"request to {self.server} failed: {exc}") from exc
        if response.is_success:
            return response.json() if response.content else None
        raise CliError(_refusal(response))

    def close(self) -> None:
        self._http.close()


def _refusal(response: httpx.Response) -> str:
    try:
        error = response.json()["error"]
        message = str(error["message"])
    except (ValueError, KeyError, TypeError):
        return f"server answered {response.status_code}: {response.text[:200]}"
    hint = ""
    if response.status_code == 401:
        hint = " (set --token / LAKESHORE_TOKEN)"
    return f"{message}{hint} [{response.status_code} {error.get('code', '')}]"
