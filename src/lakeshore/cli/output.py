"""Printing results: rich tables for people, JSON or YAML (``-o json|yaml``, ``--json``)
for scripts; ``-o wide`` shows the columns a table hides.

The format is chosen once per command line (:func:`use`, called by
:mod:`lakeshore.cli.global_options` before the command runs), so a command prints through
:func:`data`, :func:`line` and :func:`table` without passing it around."""

from __future__ import annotations

import json
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table
from rich.text import Text

console = Console()
_format: str | None = None


def use(fmt: str | None) -> None:
    """The output format of this command line: ``json``, ``yaml``, ``wide`` or None."""
    global _format
    _format = fmt


errors = Console(stderr=True, soft_wrap=True)


def note(text: str) -> None:
    """A line for people on stderr, printed as given (no markup, no wrapping)."""
    errors.print(text, markup=False, highlight=False)


def failure(text: str) -> None:
    """``error: text`` on stderr, as the CLI reports every failure."""
    errors.print(Text.assemble(("error: ", "bold red"), text))


JSON_HELP = "Print JSON (for scripts) instead of a table: the same as -o json."


def data(value: Any) -> None:
    """The whole result, as YAML with ``-o yaml``, else as JSON."""
    if _format == "yaml":
        print(yaml.safe_dump(value, sort_keys=True, allow_unicode=True), end="")
    else:
        print(json.dumps(value, indent=2, sort_keys=True))


def line(value: Any) -> None:
    """One item of a stream, flushed: a JSON line, or a YAML document with ``-o yaml``."""
    if _format == "yaml":
        text = "---\n" + yaml.safe_dump(value, sort_keys=True, allow_unicode=True)
    else:
        text = json.dumps(value, sort_keys=True) + "\n"
    print(text, end="", flush=True)


def table(
    columns: list[str],
    rows: list[list[Any]],
    *,
    title: str | None = None,
    wide: int = 0,
) -> None:
    """A table; its last ``wide`` columns are shown only with ``-o wide``."""
    shown = len(columns) if _format == "wide" or not wide else len(columns) - wide
    out = Table(*columns[:shown], title=title, header_style="bold")
    for row in rows:
        out.add_row(*(_cell(cell) for cell in row[:shown]))
    console.print(out)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        return ",".join(_cell(item) for item in value)
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return str(value)


def fields(data: dict[str, Any], *, title: str | None = None) -> None:
    out = Table(show_header=False, title=title, box=None, pad_edge=False)
    out.add_column(style="bold")
    out.add_column()
    for key, value in data.items():
        text = json.dumps(value) if isinstance(value, dict | list) else str(value)
        out.add_row(key, text)
    console.print(out)
