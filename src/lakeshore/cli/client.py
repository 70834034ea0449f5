"""The CLI's HTTP client: one place that turns refusals into messages, not tracebacks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from lakeshore import jsontext, refusals, transport


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
            self._http = transport.connect(self.server, headers=headers, timeout=timeout)
        except ValueError as exc:
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
            answer = self._http.request(method, path, json=json, params=params)
        except transport.TimedOut as exc:
            raise CliError(f"the server at {self.server} did not answer in time") from exc
        except transport.Unreachable as exc:
            raise CliError(_unreachable(self.server, exc)) from exc
        if answer.is_success:
            # read as the server reads (an integer past 64 bits stays one)
            return answer.json() if answer.content else None
        raise CliError(_refusal(answer), status=answer.status_code)

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
        try:
            # the server pings every 15 s: a minute's silence is a dead peer
            with self._http.events(path, params=params, read_s=60.0) as events:
                for event in events:
                    yield event.event, event.id, jsontext.parsed(event.data.encode())
        except transport.Refused as refused:
            answer = refused.answer
            raise CliError(_refusal(answer), status=answer.status_code) from None
        except transport.Unreachable as exc:
            if "Connect" in str(exc):
                raise CliError(_unreachable(self.server, exc)) from exc
            raise CliError(f"the stream from {self.server} broke ({exc})") from exc
        except ValueError as exc:
            raise CliError(f"the stream from {self.server} broke ({type(exc).__name__})") from exc

    def close(self) -> None:
        self._http.close()


def _unreachable(server: str, exc: transport.Unreachable) -> str:
    return (
        f"cannot reach the Lakeshore server at {server} ({exc}); "
        "is `lakeshore server` running? (--server / LAKESHORE_URL)"
    )


def _refusal(answer: transport.Answer) -> str:
    refusal = refusals.read(answer.status_code, answer.content)
    if not refusal.enveloped:
        return str(refusal)
    hint = " (set --token / LAKESHORE_TOKEN)" if refusal.status == 401 else ""
    return f"{refusal.message}{hint} [{refusal.status} {refusal.code}]"
