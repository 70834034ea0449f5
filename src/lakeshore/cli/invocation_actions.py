"""``lakeshore invocations cancel|retry``: one invocation at a time by id, or a queue's
invocations in one state at once (``--queue Q --state S``).

By id, each id is its own request: one the server refuses (a 409 for an invocation that
is not in a state the action applies to, a 404 for an unknown id) is reported on stderr
for that id and the others still go; the command exits 1 if any was refused.
"""

from __future__ import annotations

from enum import Enum, StrEnum
from typing import Annotated, Any

import typer

from lakeshore.cli import context, output
from lakeshore.cli.client import CliError
from lakeshore.cli.context import CliContext


class Retryable(StrEnum):
    failed = "failed"
    expired = "expired"
    cancelled = "cancelled"


class Cancellable(StrEnum):
    pending = "pending"
    running = "running"


Ids = Annotated[
    list[str] | None,
    typer.Argument(metavar="ID...", help="Invocation ids.", show_default=False),
]
Queue = Annotated[
    str | None,
    typer.Option("--queue", metavar="QUEUE", help="Act on this queue's invocations in --state."),
]
Json = Annotated[bool, typer.Option("--json", help=output.JSON_HELP)]


def _act(
    cli: CliContext,
    action: str,
    ids: list[str] | None,
    queue: str | None,
    state: Enum | None,
    as_json: bool,
) -> None:
    """``action`` on each of ``ids``, or on every invocation of ``queue`` in ``state``;
    refuses a mix of the two, or neither."""
    if ids and (queue or state):
        raise typer.BadParameter("give invocation ids, or --queue with --state, not both")
    if ids:
        _each(cli, action, ids, as_json)
    elif queue and state:
        _bulk(cli, action, queue, state.value, as_json)
    else:
        raise typer.BadParameter("give invocation ids, or --queue QUEUE --state STATE")


def _each(cli: CliContext, action: str, ids: list[str], as_json: bool) -> None:
    done: list[dict[str, Any]] = []
    refused = 0
    for invocation_id in ids:
        try:
            found = cli.client.request("POST", cli.ns_path("invocations", invocation_id, action))
        except CliError as exc:
            if exc.status is None:  # no server answer: the rest would fail the same way
                raise
            refused += 1
            output.failure(f"{invocation_id}: {exc}")
            continue
        done.append(found)
        if not as_json:
            output.console.print(
                f"invocation {invocation_id} is {found['state']}", markup=False, highlight=False
            )
    if as_json and (done or len(ids) > 1):
        # as kubectl does: one name asked for, one object; several, a list
        output.data(done[0] if len(ids) == 1 else done)
    if refused:
        raise typer.Exit(1)


def _bulk(cli: CliContext, action: str, queue: str, state: str, as_json: bool) -> None:
    path = cli.ns_path("queues", queue, "invocations", action)
    touched = cli.client.request("POST", path, json={"state": state})
    if as_json:
        output.data(touched)
    else:
        verb = "retried" if action == "retry" else "cancelled"
        output.console.print(
            f"{verb} {touched['touched']} {state} invocation(s) of queue {queue}",
            markup=False,
            highlight=False,
        )


def cancel(
    ctx: typer.Context,
    ids: Ids = None,
    queue: Queue = None,
    state: Annotated[
        Cancellable | None,
        typer.Option("--state", help="With --queue: cancel every invocation in this state."),
    ] = None,
    as_json: Json = False,
) -> None:
    """Cancel pending or running invocations: by id, or every one of a queue in a state.
    By id, a refusal for one id is reported and the others still go (exit 1 if any was
    refused); --json prints the cancelled invocation (several: a list). In bulk, prints how
    many were cancelled (--json: {"touched": N}).

    lakeshore invocations cancel ID [ID...]

    lakeshore invocations cancel --queue QUEUE --state pending
    """
    _act(context.get(ctx), "cancel", ids, queue, state, as_json)


def retry(
    ctx: typer.Context,
    ids: Ids = None,
    queue: Queue = None,
    state: Annotated[
        Retryable | None,
        typer.Option("--state", help="With --queue: retry every invocation in this state."),
    ] = None,
    as_json: Json = False,
) -> None:
    """Retry failed, expired or cancelled invocations: by id, or every one of a queue in
    a state. A retried invocation keeps its id and key and is pending again at the back of
    its queue, with one more attempt allowed than it used. By id, a refusal for one id
    (409: it is pending, running or succeeded) is reported and the others still go (exit 1
    if any was refused); --json prints the retried invocation (several: a list). In bulk,
    prints how many were retried (--json: {"touched": N}).

    lakeshore invocations retry ID [ID...]

    lakeshore invocations retry --queue QUEUE --state failed
    """
    _act(context.get(ctx), "retry", ids, queue, state, as_json)


def register(app: typer.Typer) -> None:
    app.command("cancel", short_help="Cancel pending or running invocations.")(cancel)
    app.command("retry", short_help="Retry failed, expired or cancelled invocations.")(retry)
