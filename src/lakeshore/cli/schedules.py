"""``lakeshore schedules``: a queue's periodic schedules (create, list, show, pause, resume,
delete)."""

from __future__ import annotations

import json
import re
from enum import StrEnum
from typing import Annotated, Any

import typer

from lakeshore.cli import context, output, verbs
from lakeshore.cli.client import CliError

app = typer.Typer(
    help="Periodic schedules: submit a function to a queue on a cron expression or at a "
    "fixed interval, each slot exactly once.",
    no_args_is_help=True,
)

Name = Annotated[str, typer.Argument(help="Schedule name.", show_default=False)]
Queue = Annotated[
    str,
    typer.Option("--queue", "-q", help="The queue the schedule submits to.", show_default=False),
]
Json = Annotated[bool, typer.Option("--json", help=output.JSON_HELP)]


class CatchUp(StrEnum):
    none = "none"
    one = "one"
    all = "all"


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")


def parse_duration(text: str) -> float:
    """``90``, ``30s``, ``5m``, ``1h30m``, ``1d`` → seconds."""
    value = text.strip().lower()
    try:
        return float(value)
    except ValueError:
        pass
    parts = _DURATION.findall(value)
    if not parts or "".join(n + u for n, u in parts) != value:
        raise typer.BadParameter(
            f"{text!r} is not a duration: give seconds (90) or units s, m, h, d (30s, 5m, 1h30m)",
            param_hint="--every",
        )
    return sum(float(number) * _UNITS[unit] for number, unit in parts)


def _json_value(text: str, flag: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise typer.BadParameter(f"{text!r} is not JSON: {exc}", param_hint=flag) from exc


def _render(schedule: dict[str, Any], as_json: bool) -> None:
    if as_json:
        output.data(schedule)
    else:
        output.fields(schedule, title=f"schedule {schedule['name']}")


def _path(cli: Any, queue: str, *rest: str) -> str:
    return str(cli.ns_path("queues", queue, "schedules", *rest))


@verbs.command(app, "create", "add")
def create(
    ctx: typer.Context,
    name: Name,
    queue: Queue,
    fn: Annotated[
        str,
        typer.Option("--fn", help="The function to call, as module:function.", show_default=False),
    ],
    cron: Annotated[
        str | None,
        typer.Option(
            "--cron",
            help='A cron expression: 5 fields ("0 3 * * *"), or 6 with seconds first '
            '("*/10 * * * * *"), read in --timezone.',
        ),
    ] = None,
    every: Annotated[
        str | None,
        typer.Option(
            "--every",
            help="A fixed interval instead of --cron: 90, 30s, 5m, 1h30m, 1d. Slots fall on "
            "whole multiples of it since 1970-01-01 UTC (every 1h: on the hour).",
        ),
    ] = None,
    arg: Annotated[
        list[str] | None,
        typer.Option("--arg", help="A positional argument, as JSON; repeat for more."),
    ] = None,
    kwargs: Annotated[
        str | None, typer.Option("--kwargs", help='Keyword arguments, as a JSON object: {"x": 1}.')
    ] = None,
    timezone: Annotated[
        str, typer.Option("--timezone", help="The IANA time zone of --cron (Europe/Paris).")
    ] = "UTC",
    catch_up: Annotated[
        CatchUp,
        typer.Option(
            "--catch-up",
            help="Slots missed while no server led: none (skip them), one (the latest), all "
            "(every one, oldest first).",
        ),
    ] = CatchUp.one,
    paused: Annotated[bool, typer.Option("--paused", help="Create it paused.")] = False,
    as_json: Json = False,
) -> None:
    """Create a schedule: the queue's leader submits FN at each slot, once."""
    cli = context.get(ctx)
    if (cron is None) == (every is None):
        raise typer.BadParameter("give one of --cron and --every", param_hint="--cron/--every")
    body: dict[str, Any] = {
        "name": name,
        "fn": fn,
        "args": [_json_value(a, "--arg") for a in arg or []],
        "timezone": timezone,
        "catch_up": catch_up.value,
        "enabled": not paused,
    }
    if kwargs is not None:
        body["kwargs"] = _json_value(kwargs, "--kwargs")
    if cron is not None:
        body["cron"] = cron
    else:
        assert every is not None
        body["every_s"] = parse_duration(every)
    _render(cli.client.request("POST", _path(cli, queue), json=body), as_json)


@app.command("list")
def list_(ctx: typer.Context, queue: Queue, as_json: Json = False) -> None:
    """List a queue's schedules, with each one's next slot."""
    cli = context.get(ctx)
    found = cli.client.request("GET", _path(cli, queue))["schedules"]
    if as_json:
        output.data(found)
        return
    rows = [
        [
            s["name"],
            s["cron"] if s["cron"] is not None else f"every {s['every_s']:g}s",
            s["fn"],
            "yes" if s["enabled"] else "paused",
            s["next_slot"],
            s["timezone"],
            s["catch_up"],
            s["last_slot"],
        ]
        for s in found
    ]
    columns = ["name", "when", "fn", "enabled", "next slot", "timezone", "catch up", "last slot"]
    output.table(columns, rows, wide=3)


@app.command("show")
def show(ctx: typer.Context, name: Name, queue: Queue, as_json: Json = False) -> None:
    """Show one schedule: its definition, last slot and next slot."""
    cli = context.get(ctx)
    _render(cli.client.request("GET", _path(cli, queue, name)), as_json)


def _switch(enabled: bool, doc: str) -> None:
    def command(ctx: typer.Context, name: Name, queue: Queue, as_json: Json = False) -> None:
        cli = context.get(ctx)
        found = cli.client.request("PATCH", _path(cli, queue, name), json={"enabled": enabled})
        if as_json:
            output.data(found)
        else:
            state = "running" if enabled else "paused"
            output.console.print(f"schedule [bold]{name}[/bold] is {state}")

    command.__doc__ = doc
    app.command("resume" if enabled else "pause")(command)


_switch(False, "Pause a schedule: no slot is submitted until it is resumed.")
_switch(True, "Resume a paused schedule from now (the slots of the pause are not submitted).")


@app.command("delete")
def delete(ctx: typer.Context, name: Name, queue: Queue) -> None:
    """Delete a schedule (the invocations it made are kept)."""
    cli = context.get(ctx)
    cli.client.request("DELETE", _path(cli, queue, name))
    output.console.print(f"schedule [bold]{name}[/bold] deleted")


__all__ = ["CliError", "app", "parse_duration"]
