"""Server settings refused before anything starts: an admin token must be 16 characters."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from lakeshore.config import Settings


def test_an_admin_token_of_16_characters_is_accepted() -> None:
    assert Settings(admin_token="x" * 16).admin_token == "x" * 16


def test_an_admin_token_of_15_characters_is_refused_saying_the_minimum() -> None:
    with pytest.raises(ValidationError, match="it needs at least 16"):
        Settings(admin_token="x" * 15)


def test_an_empty_admin_token_means_unset_so_one_is_generated() -> None:
    assert Settings(admin_token="").admin_token is None
