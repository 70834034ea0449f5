"""``lakeshore daemon run``: a worker that claims and runs invocations."""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated

import httpx
import typer

from lakeshore.cli import context, output
from lakeshore.cli.client import CliError
from lakeshore.config import read_local_admin_token as local_admin_token
from lakeshore.daemon.worker import Daemon, DaemonConfig, DaemonError

app = typer.Typer(help="Run worker daemons.", no_args_is_help=True)

RUNNERS = ("process",)


@app.command("run")
def run(
    ctx: typer.Context,
    queue: Annotated[
        list[str] | None,
        typer.Option(
            "--queue", "-q", help="Queue to serve (repeat for several; default: default)."
        ),
    ] = None,
    capacity: Annotated[int, typer.Option(help="Invocations run at once.", min=1, max=10_000)] = 1,
    tag: Annotated[
        list[str] | None, typer.Option("--tag", help="A tag (repeatable), e.g. gpu:h100.")
    ] = None,
    runner: Annotated[
        list[str] | None, typer.Option("--runner", help="How to run invocations: process.")
    ] = None,
    burst: Annotated[
        bool, typer.Option("--burst", help="Exit once the queues are empty (batch jobs, tests).")
    ] = False,
    worker_id: Annotated[
        str | None, typer.Option("--id", help="Worker id (default: generated).")
    ] = None,
    launch_id: Annotated[
        str | None,
        typer.Option("--launch-id", help="The launch this daemon answers (providers set it)."),
    ] = None,
    grace: Annotated[
        float, typer.Option(help="Seconds to let running work finish after SIGTERM.", min=0)
    ] = 30.0,
) -> None:
    """Say hello, claim invocations, run each in a child process, report, repeat.

    On SIGTERM or Ctrl-C it stops claiming, finishes what it holds, and exits.
    """
    cli = context.get(ctx)
    runners = runner or ["process"]
    unknown = sorted(set(runners) - set(RUNNERS))
    if unknown:
        raise typer.BadParameter(
            f"unknown runner {', '.join(unknown)}; available: process", param_hint="--runner"
        )
    token = cli.token or local_admin_token()
    if not token:
        raise CliError("no token: set --token / LAKESHORE_TOKEN")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise
    config = DaemonConfig(
        server=cli.server,
        token=token.strip(),
        queues=queue or [],
        namespace=cli.namespace if cli.namespace != "default" else None,
        capacity=capacity,
        tags=tag or [],
        runners=runners,
        worker_id=worker_id,
        launch_id=launch_id,
        burst=burst,
        grace_s=grace,
    )
    daemon = Daemon(config)
    try:
        asyncio.run(daemon.run())
    except DaemonError as exc:
        raise CliError(str(exc)) from exc
    except httpx.ConnectError as exc:
        raise CliError(f"cannot reach the Lakeshore server at {cli.server} ({exc})") from exc
    output.note(f"daemon stopped: {daemon.completed} succeeded, {daemon.failed} failed")
