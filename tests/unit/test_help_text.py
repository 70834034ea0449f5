"""Commands' help reflowed: one line per paragraph, for the terminal to wrap."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from lakeshore.cli import help_text
from lakeshore.cli.main import app


@pytest.mark.parametrize(
    ("docstring", "shown"),
    [
        ("One line.", "One line."),
        ("First part,\n    wrapped in the source.", "First part, wrapped in the source."),
        (
            "Summary.\n\n    Second paragraph,\n    wrapped.",
            "Summary.\n\nSecond paragraph, wrapped.",
        ),
        ("Summary.\n\n    \b\n    kept\n    as is", "Summary.\n\n\b\nkept\nas is"),
    ],
)
def test_reflow(docstring: str, shown: str) -> None:
    assert help_text.reflow(docstring) == shown


def test_every_command_of_the_cli_shows_paragraphs_unbroken() -> None:
    """A sentence the source wraps is one sentence in ``--help`` (rich wraps it at the
    terminal's width): ``queues explain``'s second line used to stand alone."""
    shown = CliRunner().invoke(app, ["queues", "--help"], env={"COLUMNS": "200"}).output
    assert "rule and signals, and what would have to change." in shown


def test_a_group_s_commands_are_reflowed_too() -> None:
    group = typer.Typer()

    @group.command()
    def hello() -> None:
        """Say
        hello."""

    parent = typer.Typer()
    parent.add_typer(group, name="greet")
    help_text.install(parent)
    assert group.registered_commands[0].help == "Say hello."
