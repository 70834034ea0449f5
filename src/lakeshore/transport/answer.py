"""What a request gets back: an :class:`Answer`, or an error that says no answer came."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lakeshore import jsontext


class Unreachable(ConnectionError):
    """No answer came: the connection was refused, cut or timed out, or what came back
    was not HTTP. The request may have reached the server; it is not sent again."""


class TimedOut(Unreachable, TimeoutError):
    """The connect or the answer took longer than its bound."""


@dataclass(frozen=True, slots=True, eq=False)
class Answer:
    """An answer: its status, its body and its headers (names in lower case)."""

    status_code: int
    content: bytes
    headers: Mapping[str, str]

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        """The body as JSON, read as the server reads it (an integer past 64 bits stays
        one)."""
        return jsontext.parsed(self.content)

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


class Refused(Exception):
    """A stream the server would not open: its answer, for the caller to read."""

    def __init__(self, answer: Answer) -> None:
        super().__init__(f"the server answered {answer.status_code}")
        self.answer = answer


@dataclass(frozen=True, slots=True)
class Event:
    """One server-sent event: its name, its id and its data."""

    event: str
    id: str
    data: str
