"""``lakeshore submit`` and ``lakeshore invocations list|show|stream`` (cancel and retry:
:mod:`lakeshore.cli.invocation_actions`)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from lakeshore.cli import bulk, context, output, schedules
from lakeshore.cli.client import CliError

app = typer.Typer(help="Inspect, follow, cancel and retry invocations.", no_args_is_help=True)

Json = Annotated[bool, typer.Option("--json", help=output.JSON_HELP)]
Id = Annotated[str, typer.Argument(help="Invocation id.", show_default=False)]


def _json_value(text: str, option: str = "--arg") -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text  # a bare word is a string: --arg hello
    except (ValueError, RecursionError) as exc:  # JSON, but more digits or depth than Python reads
        raise typer.BadParameter(unreadable(exc), param_hint=option) from None


def unreadable(exc: ValueError | RecursionError) -> str:
    """Why JSON text could not be read, in a line (not as a string: it is JSON)."""
    if isinstance(exc, RecursionError):
        return "the JSON is nested too deeply to read"
    return f"the JSON cannot be read: {str(exc).split(';')[0]}"


def _kwarg(text: str) -> tuple[str, Any]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise typer.BadParameter(f"{text!r} is not NAME=VALUE", param_hint="--kwarg")
    return name, _json_value(value, "--kwarg")


def _delay_s(text: str) -> float:
    try:
        return schedules.parse_duration(text)
    except typer.BadParameter as exc:
        raise typer.BadParameter(exc.message, param_hint="--delay") from None


def submit(
    ctx: typer.Context,
    queue: Annotated[
        str, typer.Argument(help="Queue (created as fifo if missing).", show_default=False)
    ],
    fn: Annotated[
        str, typer.Argument(help="Function as package.module:function.", show_default=False)
    ],
    arg: Annotated[
        list[str] | None,
        typer.Option("--arg", metavar="JSON", help="A positional argument, as JSON (repeatable)."),
    ] = None,
    kwarg: Annotated[
        list[str] | None,
        typer.Option(
            "--kwarg", metavar="NAME=JSON", help="A keyword argument NAME=JSON (repeatable)."
        ),
    ] = None,
    key: Annotated[
        str | None, typer.Option(help="Idempotency key: a repeat returns the first.")
    ] = None,
    max_attempts: Annotated[
        int | None, typer.Option(help="Attempts before it fails (default 3).")
    ] = None,
    timeout: Annotated[float | None, typer.Option(help="Seconds one attempt may run.")] = None,
    delay: Annotated[
        str | None,
        typer.Option(
            metavar="DURATION",
            help="Hold it back this long before any daemon may start it: seconds (90) or "
            "units s, m, h, d (30s, 5m, 1h30m); at most a year. Until then it counts as "
            "scheduled, not pending.",
            show_default=False,
        ),
    ] = None,
    not_before: Annotated[
        str | None,
        typer.Option(
            "--not-before",
            metavar="TIME",
            help="Start it no earlier than TIME, an RFC 3339 time with its offset "
            "(2026-05-01T09:30:00Z, 2026-05-01T11:30:00+02:00); at most a year ahead. "
            "Not with --delay.",
            show_default=False,
        ),
    ] = None,
    from_file: Annotated[
        str | None,
        typer.Option(
            "--from-file",
            metavar="FILE",
            help="Submit many calls of FN: one JSON object a line ({args, kwargs, key, "
            "delay_s, not_before, max_attempts, timeout_s}, each optional; - reads standard "
            "input), in batches of 1,000. The file is checked first: a bad line is reported "
            "with its number and nothing is submitted. --max-attempts and --timeout apply "
            "to lines that do not say.",
            show_default=False,
        ),
    ] = None,
    as_json: Json = False,
) -> None:
    """Submit one invocation of FN to QUEUE (now, or later with --delay / --not-before),
    or many with --from-file."""
    cli = context.get(ctx)
    if from_file is not None:
        if arg or kwarg or key or delay or not_before:
            raise typer.BadParameter(
                "the calls' arguments, keys and delays come from the file: "
                "--arg, --kwarg, --key, --delay and --not-before go with one call",
                param_hint="--from-file",
            )
        defaults = {"max_attempts": max_attempts, "timeout_s": timeout}
        _submit_file(cli, queue, fn, from_file, defaults, as_json=as_json)
        return
    body: dict[str, Any] = {
        "fn": fn,
        "args": [_json_value(a) for a in arg or []],
        "kwargs": dict(_kwarg(k) for k in kwarg or []),
    }
    for name, value in (("key", key), ("max_attempts", max_attempts), ("timeout_s", timeout)):
        if value is not None:
            body[name] = value
    if delay is not None and not_before is not None:
        raise typer.BadParameter("give --delay or --not-before, not both", param_hint="--delay")
    if delay is not None:
        body["delay_s"] = _delay_s(delay)
    if not_before is not None:
        body["not_before"] = not_before  # the server reads it, and says what is wrong
    created = cli.client.request("POST", cli.ns_path("queues", queue, "invocations"), json=body)
    if as_json:
        output.data(created)
    else:
        print(created["id"])


def _submit_file(
    cli: context.CliContext,
    queue: str,
    fn: str,
    path: str,
    defaults: dict[str, Any],
    *,
    as_json: bool,
) -> None:
    try:
        lines = bulk.lines_of(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"cannot read {path}: {exc}") from None
    calls, bad = bulk.read(lines)
    if bad:
        raise CliError(f"{path}: {len(bad)} bad line(s), nothing submitted\n{bulk.shown(bad)}")
    given = {name: value for name, value in defaults.items() if value is not None}
    ids: list[str] = []
    route = cli.ns_path("queues", queue, "invocations", "batch")
    with bulk.progress(len(calls)) as bar:
        for batch in bulk.batches(calls):
            items = [{"fn": fn, **given, **call.body} for call in batch]
            try:
                made = cli.client.request(
                    "POST", route, json={"invocations": items}, params={"answer": "ids"}
                )
            except CliError as exc:
                raise CliError(
                    f"lines {batch[0].line}-{batch[-1].line} refused: {exc}; "
                    f"{len(ids)} submitted before them, none of this batch",
                    status=exc.status,
                ) from None
            ids += [invocation["id"] for invocation in made["invocations"]]
            bar.advance(bar.task_ids[0], len(batch))
    if as_json:
        output.data({"submitted": len(ids), "ids": ids})
    else:
        print(f"submitted {len(ids)} invocation(s) of {fn} to {queue}")


@app.command("list")
def list_(
    ctx: typer.Context,
    queue: Annotated[str, typer.Argument(help="Queue name.", show_default=False)],
    state: Annotated[
        list[str] | None,
        typer.Option("--state", metavar="STATE", help="Only this state (repeatable)."),
    ] = None,
    limit: Annotated[int, typer.Option(help="Most rows to show.", min=1, max=1000)] = 50,
    cursor: Annotated[
        str | None,
        typer.Option(
            metavar="CURSOR",
            help="Start where an earlier page ended (the cursor it printed).",
            show_default=False,
        ),
    ] = None,
    as_json: Json = False,
) -> None:
    """List a queue's invocations, newest first, a page at a time. With --json, the rows
    are printed as a JSON list; the next page's cursor, if any, goes to stderr."""
    cli = context.get(ctx)
    params: dict[str, Any] = {"limit": limit}
    if state:
        params["state"] = state
    if cursor:
        params["cursor"] = cursor
    page = cli.client.request("GET", cli.ns_path("queues", queue, "invocations"), params=params)
    rows = page["invocations"]
    more = page.get("next_cursor")
    if as_json:
        output.data(rows)
        if more:
            typer.echo(f"next page: --cursor {more}", err=True)
        return
    output.table(
        [
            *("id", "fn", "state", "attempts", "worker", "created"),
            *("key", "priority", "started", "finished", "error"),  # -o wide
        ],
        [
            [
                r["id"],
                r["fn"],
                r["state"],
                f"{r['attempts']}/{r['max_attempts']}",
                r["worker"],
                r["created_at"],
                r["key"],
                r["priority"],
                r["started_at"],
                r["finished_at"],
                (r["error"] or {}).get("type"),
            ]
            for r in rows
        ],
        wide=5,
    )
    if more:
        typer.echo(f"more: lakeshore invocations list {queue} --cursor {more}", err=True)


def _follow(cli: context.CliContext, invocation_id: str, after: int) -> dict[str, Any]:
    """Print a generator invocation's items as they arrive (one JSON line each), then
    return the invocation in its final state (the stream's ``end`` event)."""
    path = cli.ns_path("invocations", invocation_id, "stream")
    for event, _, data in cli.client.events(path, params={"after": after}):
        if event == "item":
            output.line(data)
        elif event == "end":
            ended: dict[str, Any] = data
            return ended
    raise CliError(f"the stream of invocation {invocation_id} ended before the invocation")


def _outcome(found: dict[str, Any]) -> None:
    """The final state on stderr; exit 1 unless the invocation succeeded."""
    error = found.get("error") or {}
    detail = f": {error.get('type')}: {error.get('message')}" if error else ""
    output.note(f"invocation {found['id']} {found['state']}{detail}")
    if found["state"] != "succeeded":
        raise typer.Exit(1)


@app.command("show")
def show(
    ctx: typer.Context,
    invocation_id: Id,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow",
            "-f",
            help="Wait for the invocation to end, printing a generator's items as they "
            "arrive (one JSON line each), then show it; exit 1 unless it succeeded.",
        ),
    ] = False,
    as_json: Json = False,
) -> None:
    """Show one invocation, with its result or error."""
    cli = context.get(ctx)
    if follow:
        found = _follow(cli, invocation_id, -1)
    else:
        found = cli.client.request("GET", cli.ns_path("invocations", invocation_id))
    if as_json:
        output.data(found)
    else:
        output.fields(found, title=f"invocation {invocation_id}")
    if follow:
        _outcome(found)


@app.command("stream")
def stream(
    ctx: typer.Context,
    invocation_id: Id,
    after: Annotated[
        int, typer.Option(help="Start after this item number (items count from 0).")
    ] = -1,
) -> None:
    """Print a generator invocation's items as they arrive (one JSON line each), then its
    final state; exits 1 unless it succeeded."""
    _outcome(_follow(context.get(ctx), invocation_id, after))
