"""Page cursors read back only as this server issues them, one message for any fault;
record ids drawn in a batch are the same shape as one drawn alone; request text a store
could not keep is refused with its reason."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

import pytest

from lakeshore.domain import cursors, ids, jsonsafe
from lakeshore.errors import InvalidInput

AT = datetime(2026, 3, 1, 12, 30, 15, 123456, tzinfo=UTC)


@pytest.mark.parametrize("cursor", [None, ""])
def test_no_cursor_is_the_first_page(cursor: str | None) -> None:
    assert cursors.parse(cursor) is None


def test_a_cursor_reads_back_as_issued_in_utc() -> None:
    paris = AT.astimezone(timezone(timedelta(hours=1)))
    assert cursors.parse(cursors.issue(paris, "inv_0a|b")) == (AT, "inv_0a|b")
    assert cursors.parse(cursors.issue(AT, "q_1"))[0].tzinfo is UTC  # type: ignore[index]


@pytest.mark.parametrize(
    "cursor",
    [
        "2026-03-01T12:30:15+00:00",  # no id
        "2026-03-01T12:30:15+00:00|",  # an empty id
        "2026-03-01T12:30:15+00:00|inv_é",  # not ASCII
        "2026-03-01T12:30:15+00:00|inv\t1",  # not printable
        "2026-03-01T12:30:15|inv_1",  # a time without a zone
        "yesterday|inv_1",  # not a time
        "9999-12-31T23:59:59-23:59|inv_1",  # past what UTC can hold
        "|inv_1",
    ],
)
def test_anything_else_is_one_refusal_naming_the_cursor(cursor: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        cursors.parse(cursor)
    assert (refused.value.message, refused.value.field) == (
        "not a cursor this server issued",
        "cursor",
    )


@pytest.mark.parametrize("count", [1, 2, 7])
def test_ids_of_a_batch_are_distinct_and_shaped_as_one_alone(count: int) -> None:
    made = ids.new_ids("inv", count)
    shape = re.compile(r"inv_[0-9a-f]{20}")
    assert len(made) == len(set(made)) == count
    assert all(shape.fullmatch(one) for one in [*made, ids.new_id("inv")])


def test_no_ids_for_none_asked() -> None:
    assert ids.new_ids("inv", 0) == []


def test_storable_text_is_itself_and_other_text_is_refused_with_its_reason() -> None:
    assert jsonsafe.check_text("label é ✓") == "label é ✓"
    with pytest.raises(ValueError, match=r"^text may not contain NUL characters$"):
        jsonsafe.check_text("a\x00b")
    with pytest.raises(ValueError, match=r"lone surrogate"):
        jsonsafe.check_text("a\ud800b")
