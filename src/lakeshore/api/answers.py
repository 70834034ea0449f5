"""Answers encoded by orjson, for the routes on the hot path (submits, claims, reports).

FastAPI's own answer validates the returned value against the route's model and walks it
with its encoder, field by field, before the standard library writes it: for a claim of
250 invocations or a batch of 1,000, more than the route's own work. These routes build
plain JSON values already, so they are written as they are. An integer past 64 bits
(orjson refuses those) is left to the standard library, as the framework's own answer
would be.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from fastapi import Response


def json_body(content: Any) -> bytes:
    """``content`` encoded as JSON."""
    try:
        return orjson.dumps(content)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return json.dumps(
            content, ensure_ascii=False, allow_nan=False, separators=(",", ":")
        ).encode()


class JsonAnswer(Response):
    """An encoded JSON answer, its two headers written once (Starlette's own
    ``Response`` works them out from a mapping on every answer)."""

    media_type = "application/json"

    def __init__(self, body: bytes, status_code: int = 200) -> None:
        self.body = body
        self.status_code = status_code
        self.background = None
        self.raw_headers = [
            (b"content-length", str(len(body)).encode()),
            (b"content-type", b"application/json"),
        ]


def json_answer(content: Any, status_code: int = 200) -> Response:
    """``content`` as a JSON answer."""
    return JsonAnswer(json_body(content), status_code)
