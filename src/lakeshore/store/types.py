"""Column types that behave the same on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, DateTime
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator


class _ExactJson(TypeDecorator[Any]):
    """JSON that reads back as it was written, on both stores.

    PostgreSQL's ``json`` (not ``jsonb``) keeps the text it was given (``jsonb`` turns
    1e+23 into the integer 100000000000000000000000). SQLite gives a column declared
    ``JSON`` numeric affinity: JSON text that is a bare number (a result or a stream
    item, never args or kwargs) would be stored as a number, 2**64 + 1 as the float
    1.8446744073709552e+19 and 1.0 as the integer 1; such text is bound as bytes, which
    SQLite keeps as they are (a BLOB) and the JSON type reads back as JSON. Nothing
    queries inside these documents; values the controller filters on have columns of
    their own."""

    impl = JSON
    cache_ok = True

    def bind_processor(self, dialect: Dialect) -> Any:
        inner = self.impl_instance.bind_processor(dialect)  # the JSON text, written
        if dialect.name != "sqlite" or inner is None:
            return inner

        def process(value: Any) -> Any:
            text = inner(value)
            if isinstance(text, str) and text[:1] in _NUMBER_STARTS:
                return text.encode()
            return text

        return process


_NUMBER_STARTS = frozenset("-0123456789")
Json = _ExactJson()


class UTCDateTime(TypeDecorator[datetime]):
    """Timestamps are stored in UTC and always read back timezone-aware.

    PostgreSQL keeps the zone (``timestamptz``); SQLite keeps none, so values go in as
    naive UTC and come back with UTC attached. Fixed-width ISO text on SQLite keeps
    comparisons in SQL (lease expiry, backoff) correct.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the store; pass an aware UTC time")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def result_processor(self, dialect: Dialect, coltype: Any) -> Any:
        """On SQLite the stored text is read with ``datetime.fromisoformat`` (C; the
        generic processor's regular expression costs ~5 µs a value, which a tick reading
        50,000 workers pays 50,000 times)."""
        if dialect.name != "sqlite":
            return super().result_processor(dialect, coltype)

        def process(value: Any) -> datetime | None:
            if value is None:
                return None
            if isinstance(value, str):
                return datetime.fromisoformat(value).replace(tzinfo=UTC)
            return self.process_result_value(value, dialect)

        return process

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        assert isinstance(value, datetime)
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)
