"""One verb set for every resource, as kubectl has: ``create`` and ``delete`` (beside
``list``, ``show``, ``patch``). The spellings used before (``add``, ``remove``, ``launch``,
``kill``, ``revoke``) stay as hidden aliases, so scripts that use them keep working."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer

Command = Callable[..., Any]


def command(app: typer.Typer, name: str, *aliases: str) -> Callable[[Command], Command]:
    """Register a command under ``name``, and under each of ``aliases`` hidden from help."""

    def register(fn: Command) -> Command:
        app.command(name)(fn)
        for alias in aliases:
            app.command(alias, hidden=True)(fn)
        return fn

    return register
