"""One error shape for every refusal: ``{"error": {"code", "message", "field"?}}``.

Lakeshore's own errors carry their status (see :mod:`lakeshore.errors`); framework errors
(unknown route, wrong method, malformed JSON, a body over the cap) and database outages
are mapped here, and anything unexpected becomes a 500 without a traceback in the body.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import InterfaceError, OperationalError
from starlette.exceptions import HTTPException

from lakeshore.domain.jsonsafe import printable
from lakeshore.domain.validation import describe
from lakeshore.errors import LakeshoreError, TooManyRequests, Unauthorized

log = logging.getLogger("lakeshore.api")

_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid",
    429: "too_many_requests",
}


def error_response(
    status: int,
    code: str,
    message: str,
    field: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    # messages may quote user input: make sure they can always be encoded
    error: dict[str, Any] = {"code": code, "message": printable(message)}
    if field:
        error["field"] = printable(field)
    return JSONResponse({"error": error}, status_code=status, headers=headers)


async def _lakeshore_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, LakeshoreError)
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, Unauthorized) else None
    if isinstance(exc, TooManyRequests) and exc.retry_after is not None:
        headers = exc.headers
    return error_response(exc.status, exc.code, exc.message, exc.field, headers)


async def _validation_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    first = dict(errors[0]) if errors else {}
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "malformed")
        return error_response(400, "invalid_json", f"request body is not valid JSON: {detail}")
    loc = tuple(first.get("loc", ()))
    first["loc"] = loc[1:] if loc[:1] in (("body",), ("query",), ("path",), ("header",)) else loc
    field, message = describe(first)
    if not field and loc[:1] == ("body",):
        message = f"request body: {message}"
    return error_response(422, "invalid", f"{field}: {message}" if field else message, field)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404 and exc.detail == "Not Found":
        message = f"no route {request.method} {request.url.path}"
    elif exc.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path}"
    else:
        message = str(exc.detail)
    code = _CODES.get(exc.status_code, "http_error")
    return error_response(exc.status_code, code, message, headers=exc.headers)


def store_down(exc: Exception) -> JSONResponse:
    """The answer to a request the database could not serve (503: retry shortly)."""
    log.error("store unavailable: %s", exc)
    return error_response(503, "store_unavailable", "the database is unavailable; retry shortly")


async def _store_down(_request: Request, exc: Exception) -> JSONResponse:
    return store_down(exc)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, "internal_error", "internal error; the server log has details")


def install(app: FastAPI) -> None:
    app.add_exception_handler(LakeshoreError, _lakeshore_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(OperationalError, _store_down)
    app.add_exception_handler(InterfaceError, _store_down)
    app.add_exception_handler(Exception, _unexpected)
