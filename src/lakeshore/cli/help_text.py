"""Commands' help as their docstrings say it, reflowed: a docstring's lines are wrapped
at the source's width, and the terminal's width is another; this typer keeps the line
breaks of every paragraph after the first, so ``--help`` showed ragged lines. Each
paragraph becomes one line for rich to wrap; a paragraph that starts with ``\\b`` (click's
mark for "keep these line breaks") is left as it is."""

from __future__ import annotations

import inspect

import typer


def reflow(text: str) -> str:
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(
        p if p.startswith("\b") else " ".join(line.strip() for line in p.splitlines())
        for p in paragraphs
    )


def install(app: typer.Typer) -> None:
    """Reflow the help of every command under ``app`` (call once the tree is complete)."""
    for info in app.registered_commands:
        text = info.help or (info.callback.__doc__ if info.callback is not None else None)
        if text:
            info.help = reflow(text)
    for group in app.registered_groups:
        if group.typer_instance is not None:
            install(group.typer_instance)
