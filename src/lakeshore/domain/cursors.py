"""Page cursors of the lists ordered newest first: ``<created_at ISO time>|<id>``.

A cursor is opaque to clients but comes back from them, so reading one refuses anything
this server could not have issued — with one message, whatever is wrong — before it
reaches the store: a time without a zone, one whose UTC time falls outside the years
1-9999 (``9999-12-31T23:59:59-23:59``), and an id that is not printable ASCII (ids are).
"""

from __future__ import annotations

from datetime import UTC, datetime

from lakeshore.errors import InvalidInput


def issue(created_at: datetime, record_id: str) -> str:
    """The cursor of the page that starts after this record."""
    return f"{created_at.isoformat()}|{record_id}"


def parse(cursor: str | None) -> tuple[datetime, str] | None:
    """``(created_at in UTC, id)`` of a cursor :func:`issue` made; None for no cursor."""
    if not cursor:
        return None
    refusal = InvalidInput("not a cursor this server issued", field="cursor")
    stamp, _, last_id = cursor.partition("|")
    if not (last_id and last_id.isascii() and last_id.isprintable()):
        raise refusal
    try:
        after = datetime.fromisoformat(stamp)
        if after.tzinfo is None:
            raise refusal
        return after.astimezone(UTC), last_id
    except (ValueError, OverflowError) as exc:  # not a time, or one UTC cannot hold
        raise refusal from exc
