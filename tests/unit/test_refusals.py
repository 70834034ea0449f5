"""The server's error envelope, read once for every client (lakeshore/refusals.py)."""

from __future__ import annotations

import pytest

from lakeshore.refusals import TEXT_CHARS, Refusal, read


@pytest.mark.parametrize(
    ("status", "body", "refusal"),
    [
        (
            404,
            b'{"error": {"code": "not_found", "message": "queue \\"q\\" not found"}}',
            Refusal(404, "not_found", 'queue "q" not found', enveloped=True),
        ),
        (  # fields beyond code and message are the caller's to read
            422,
            b'{"error": {"code": "invalid", "message": "bad", "field": "fn"}}',
            Refusal(422, "invalid", "bad", enveloped=True),
        ),
        (
            502,
            b"<html>Bad Gateway</html>",
            Refusal(502, "http_error", "<html>Bad Gateway</html>", enveloped=False),
        ),
        (500, b'{"detail": "x"}', Refusal(500, "http_error", '{"detail": "x"}', enveloped=False)),
        (500, b'["error"]', Refusal(500, "http_error", '["error"]', enveloped=False)),
        (503, b"", Refusal(503, "http_error", "", enveloped=False)),
        (400, b"\xff\xfe", Refusal(400, "http_error", "\ufffd\ufffd", enveloped=False)),
    ],
)
def test_read(status: int, body: bytes, refusal: Refusal) -> None:
    assert read(status, body) == refusal


def test_a_long_body_that_is_not_the_envelope_is_cut() -> None:
    assert len(read(502, b"x" * 10_000).message) == TEXT_CHARS


def test_as_text() -> None:
    assert str(read(409, b'{"error": {"code": "conflict", "message": "taken"}}')) == (
        "taken [409 conflict]"
    )
    assert str(read(502, b"down")) == "server answered 502: down"
