"""The ``lakeshore apply`` command's options; its work (``lakeshore.cli.apply``, with the
file's models) is imported only when it runs, so other commands start faster."""

from __future__ import annotations

from typing import Annotated

import typer


def apply(
    ctx: typer.Context,
    file: Annotated[
        str,
        typer.Option(
            "--file",
            "-f",
            help="The file to apply (lakeshore.yaml; - reads standard input).",
            show_default=False,
        ),
    ],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the changes and make none.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the plan and its results as JSON.")
    ] = False,
) -> None:
    """Create or change providers, queues, schedules and compose counts to match a file.

    Idempotent: a second run reports everything unchanged. Nothing absent from the file is
    deleted, and fields a queue in the file does not set are left alone. See docs/apply.md.
    """
    from lakeshore.cli import apply as applying

    applying.run(ctx, file, dry_run=dry_run, as_json=as_json)
