"""The CLI's HTTP client: one place that turns refusals into messages, not tracebacks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
from httpx_sse import SSEError, connect_sse

from lakeshore import jsontext, refusals

_JSON = {"Content-Type": "application/json"}


class CliError(Exception):
    """A failure to show the user as one line, then exit non-zero; ``status`` is the
    server's HTTP status when the server refused the request."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ApiClient:
    def __init__(self, server: str, token: str | None, *, timeout: float = 30.0) -> None:
        token = (token or "").strip()
        if token and not (token.isascii() and token.isprintable() and " " not in token):
            # never echo it: a mistyped token is still mostly a secret
            raise CliError(
                "the token holds characters no token has; check --token / LAKESHORE_TOKEN"
            )
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.server = server.rstrip("/")
        try:
            self._http = httpx.Client(base_url=self.server, headers=headers, timeout=timeout)
        except (httpx.InvalidURL, ValueError) as exc:
            raise CliError(f"not a server URL: {server!r} (--server / LAKESHORE_URL)") from exc

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
    ) -> Any:
        try:
            # written as the SDK writes it: a NaN reaches the server, refused by name
            content, headers = (None, None) if json is None else (jsontext.encoded(json), _JSON)
            response = self._http.request(
                method, path, content=content, headers=headers, params=params
            )
        except httpx.ConnectError as exc:
            raise CliError(
                f"cannot reach the Lakeshore server at {self.server} ({exc}); "
                "is `lakeshore server` running? (--server / LAKESHORE_URL)"
            ) from exc
        except httpx.TimeoutException as exc:
            raise CliError(f"the server at {self.server} did not answer in time") from exc
        except httpx.HTTPError as exc:
            # the message of a protocol error can quote headers, the token among them
            raise CliError(f"request to {self.server} failed ({type(exc).__name__})") from exc
        if response.is_success:
            # read as the server reads (an integer past 64 bits stays one)
            return jsontext.parsed(response.content) if response.content else None
        raise CliError(_refusal(response), status=response.status_code)

    def every_page(self, path: str, key: str, *, params: dict[str, Any] | None = None) -> list[Any]:
        """All the rows of a paged list (``{key: [...], "next_cursor"}``): each page in
        turn, asked for with the cursor of the one before, until a page has none."""
        rows: list[Any] = []
        query = dict(params or {})
        while True:
            page = self.request("GET", path, params=query)
            rows.extend(page[key])
            cursor = page.get("next_cursor")
            if not cursor:
                return rows
            if cursor == query.get("cursor"):
                raise CliError(f"the server sent the same page of {key} twice; stopping")
            query["cursor"] = cursor

    def events(self, path: str, *, params: dict[str, Any] | None = None) -> Iterator[Any]:
        """Server-sent events from ``path``: (event, id, data as JSON) as they arrive."""
        timeout = httpx.Timeout(30.0, read=60.0)  # the server pings every 15 s
        try:
            with connect_sse(self._http, "GET", path, params=params, timeout=timeout) as source:
                if not source.response.is_success:
                    source.response.read()
                    raise CliError(_refusal(source.response), status=source.response.status_code)
                for event in source.iter_sse():
                    yield event.event, event.id, jsontext.parsed(event.data.encode())
        except httpx.ConnectError as exc:
            raise CliError(
                f"cannot reach the Lakeshore server at {self.server} ({exc}); "
                "is `lakeshore server` running? (--server / LAKESHORE_URL)"
            ) from exc
        except (httpx.HTTPError, SSEError, ValueError) as exc:
            raise CliError(f"the stream from {self.server} broke ({type(exc).__name__})") from exc

    def close(self) -> None:
        self._http.close()


def _refusal(response: httpx.Response) -> str:
    refusal = refusals.read(response.status_code, response.content)
    if not refusal.enveloped:
        return str(refusal)
    hint = " (set --token / LAKESHORE_TOKEN)" if refusal.status == 401 else ""
    return f"{refusal.message}{hint} [{refusal.status} {refusal.code}]"
