"""How the server and the daemon log: ``text`` (the default) or ``json``, one object per
line, with the ids a line is about as fields of their own.

A log call names what it is about with ``extra=ids(queue=..., invocation=...)``; the
fields are :data:`FIELDS`. In ``text`` they follow the message as ``key=value``; in
``json`` (``python-json-logger``) each is a key of the line's object, beside
``time``, ``level``, ``logger`` and ``message``. uvicorn's own lines, its access log
included, go through the same formatter.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import logging.config
from collections.abc import Iterator
from typing import Any, Final

from pythonjsonlogger.core import RESERVED_ATTRS

FORMATS: Final = ("text", "json")
FIELDS: Final = ("namespace", "queue", "invocation", "worker", "launch", "provider", "action")
TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s %(message)s"


def ids(**found: Any) -> dict[str, Any]:
    """The ``extra`` of a log call: the ids it is about (``None`` ones left out)."""
    unknown = set(found) - set(FIELDS)
    assert not unknown, f"not a log field: {unknown}"
    return {key: value for key, value in found.items() if value is not None}


_BOUND: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("lakeshore_log_ids")


@contextlib.contextmanager
def bound(**found: Any) -> Iterator[None]:
    """Every line logged in this context (and the asyncio tasks started in it) carries
    these ids too: a daemon binds its worker id once."""
    token = _BOUND.set({**_BOUND.get({}), **ids(**found)})
    try:
        yield
    finally:
        _BOUND.reset(token)


class BoundIds(logging.Filter):
    """Puts the ids of :func:`bound` on each record (those the call gave win)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in _BOUND.get({}).items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


class TextFormatter(logging.Formatter):
    """The message, then the ids it carries as ``key=value``."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        pairs = [f"{key}={getattr(record, key)}" for key in FIELDS if hasattr(record, key)]
        return f"{line} {' '.join(pairs)}" if pairs else line


def check(fmt: str) -> str:
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: use text or json")
    return fmt


def config(fmt: str, level: str = "info") -> dict[str, Any]:
    """A ``logging.config.dictConfig`` for ``fmt``, uvicorn's loggers included (pass it
    as uvicorn's ``log_config``)."""
    check(fmt)
    formatter: dict[str, Any] = (
        {"()": TextFormatter}
        if fmt == "text"
        else {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": "%(levelname)s %(name)s %(message)s",
            "timestamp": "time",  # ISO 8601, UTC
            "rename_fields": {"levelname": "level", "name": "logger"},
            # uvicorn's access log passes its parts as arguments, not as fields
            "reserved_attrs": [*RESERVED_ATTRS, "taskName", "color_message"],
        }
    )
    upper = level.upper()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"lakeshore": formatter},
        "filters": {"ids": {"()": BoundIds}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "lakeshore",
                "filters": ["ids"],
                "stream": "ext://sys.stderr",
            }
        },
        "root": {"handlers": ["stderr"], "level": upper},
        "loggers": {
            # uvicorn's own handlers replaced by the root's: one format for every line
            "uvicorn": {"handlers": [], "level": upper, "propagate": True},
            "uvicorn.error": {"handlers": [], "level": upper, "propagate": True},
            "uvicorn.access": {"handlers": [], "level": upper, "propagate": True},
            "httpx": {"level": "WARNING"},  # a line per request is noise
        },
    }


def setup(fmt: str, level: str = "info") -> None:
    logging.config.dictConfig(config(fmt, level))
