"""The server's refusals as every client reads them: one decoder of the error envelope.

Every refusal the API sends is ``{"error": {"code", "message", ...}}`` with a 4xx or 5xx
status (``lakeshore.api.errors``). The SDK, the CLI and the daemon (its claims, reports
and streams) read it here, so a change to the envelope is made once. A body that is not
the envelope (a proxy's page, a truncated answer) is kept as text, at most
:data:`TEXT_CHARS` of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from lakeshore import jsontext

TEXT_CHARS: Final = 200


@dataclass(frozen=True)
class Refusal:
    status: int
    code: str  # the envelope's, or "http_error" when the body is not the envelope
    message: str  # the envelope's, or the start of the body as text
    enveloped: bool  # whether the body was the server's error envelope

    def __str__(self) -> str:
        if self.enveloped:
            return f"{self.message} [{self.status} {self.code}]"
        return f"server answered {self.status}: {self.message}"


def read(status: int, content: bytes) -> Refusal:
    """The refusal a ``status`` answer with body ``content`` carries."""
    try:
        error = jsontext.parsed(content)["error"]
        return Refusal(status, str(error["code"]), str(error["message"]), enveloped=True)
    except (ValueError, KeyError, TypeError, RecursionError):
        text = content[:TEXT_CHARS].decode("utf-8", "replace")
        return Refusal(status, "http_error", text, enveloped=False)
