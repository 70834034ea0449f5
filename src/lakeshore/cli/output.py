"""Printing results: rich for people, plain JSON (``--json``) for scripts."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

console = Console()
errors = Console(stderr=True, soft_wrap=True)


def note(text: str) -> None:
    """A line for people on stderr, printed as given (no markup, no wrapping)."""
    errors.print(text, markup=False, highlight=False)


def failure(text: str) -> None:
    """``error: text`` on stderr, as the CLI reports every failure."""
    errors.print(Text.assemble(("error: ", "bold red"), text))


JSON_HELP = "Print JSON (for scripts) instead of a table."


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True))


def table(columns: list[str], rows: list[list[Any]], *, title: str | None = None) -> None:
    out = Table(*columns, title=title, header_style="bold")
    for row in rows:
        out.add_row(*("" if cell is None else str(cell) for cell in row))
    console.print(out)


def fields(data: dict[str, Any], *, title: str | None = None) -> None:
    out = Table(show_header=False, title=title, box=None, pad_edge=False)
    out.add_column(style="bold")
    out.add_column()
    for key, value in data.items():
        text = json.dumps(value) if isinstance(value, dict | list) else str(value)
        out.add_row(key, text)
    console.print(out)
