"""``lakeshore daemon run|create|list|delete``: run a worker here, or manage the fleet."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from lakeshore import logs, runtime, transport
from lakeshore.cli import context, exiting, output, verbs
from lakeshore.cli.client import CliError
from lakeshore.cli.server import Format, LogFormat
from lakeshore.defaults import read_local_admin_token as local_admin_token
from lakeshore.domain import runners as daemon_runners

app = typer.Typer(
    help="Run a worker daemon here, or create (launch), list and delete (retire) daemons.",
    no_args_is_help=True,
)

T = TypeVar("T")


def on_fastest_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` on uvloop where it is installed (not on Windows), else on asyncio's
    own loop, as the server does. In the drain (``bench/peers.py``, six rounds alternating)
    uvloop cost the daemon and its children 3 % less CPU a job, and an idle worker's
    submit->start 0.1-0.25 ms less on SQLite."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def code_path(given: list[Path] | None) -> list[str]:
    """Where the daemon imports UDF modules from: ``--path``, else ``LAKESHORE_PATH``, else
    the current directory (a console script's ``sys.path[0]`` is its ``bin/``, not where
    it was started), each made absolute; a directory that does not exist is refused."""
    if given:
        dirs, hint = list(given), "--path"
    else:
        listed = [d for d in os.environ.get("LAKESHORE_PATH", "").split(os.pathsep) if d]
        dirs, hint = [Path(d) for d in listed] or [Path.cwd()], "LAKESHORE_PATH"
    found = []
    for directory in dirs:
        resolved = directory.expanduser().resolve()
        if not resolved.is_dir():
            raise typer.BadParameter(f"{directory}: no such directory", param_hint=hint)
        found.append(str(resolved))
    return found


@app.command("run")
def run(
    ctx: typer.Context,
    queue: Annotated[
        list[str] | None,
        typer.Option(
            "--queue",
            "-q",
            metavar="QUEUE",
            help="Queue to serve (repeat for several; default: default).",
        ),
    ] = None,
    capacity: Annotated[
        int,
        typer.Option(
            help="Invocations run at once; also the most pool children it keeps.",
            min=1,
            max=10_000,
        ),
    ] = 1,
    log_format: LogFormat = Format.text,
    prefetch: Annotated[
        int | None,
        typer.Option(
            metavar="N",
            help="Claim up to N invocations beyond --capacity, to start the moment a slot "
            "frees instead of after a round trip to the server. Unset, the daemon learns "
            "it as it runs: hundreds for a fast stream of tiny invocations, none for long "
            "ones (so another daemon can take them), at most 1,000 "
            "(docs/taskqueue.md#prefetch). Held invocations count as running (their "
            "leases are kept) while they wait. 0: never claim ahead.",
            min=0,
            max=10_000,
        ),
    ] = None,
    tag: Annotated[
        list[str] | None,
        typer.Option("--tag", metavar="TAG", help="A tag (repeatable), e.g. gpu:h100."),
    ] = None,
    runner: Annotated[
        str,
        typer.Option(
            "--runner",
            metavar="RUNNER",
            help="How invocations run: process (a warm pool of child processes, each "
            "running many invocations in turn; a crash or time-out takes only its own) or "
            "thread (threads of the daemon itself: for I/O-bound code that needs no "
            "isolation; a crash takes the daemon down, and its work is retried).",
        ),
    ] = daemon_runners.PROCESS,
    burst: Annotated[
        bool,
        typer.Option(
            "--burst",
            help="Exit once nothing it runs is left and its queues hold no pending work "
            "(retries waiting out a backoff are waited for); for batch jobs and tests.",
        ),
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
    path: Annotated[
        list[Path] | None,
        typer.Option(
            "--path",
            metavar="DIR",
            help="Import UDF modules from DIR (repeatable; put first on the daemon's "
            "sys.path). Default: LAKESHORE_PATH (directories separated by "
            f"{os.pathsep!r}), else the current directory.",
            file_okay=False,
            show_default=False,
        ),
    ] = None,
    preload: Annotated[
        list[str] | None,
        typer.Option(
            "--preload",
            metavar="MODULE",
            help="Import this module in each pool child as it starts (repeatable), before "
            "its first invocation: heavy libraries (torch, your model code) are then "
            "imported once per child. A module that cannot be found stops the daemon at "
            "start; one that fails to import fails the invocations it holds up. With "
            "--runner thread, imported once in the daemon.",
        ),
    ] = None,
    max_invocations_per_child: Annotated[
        int | None,
        typer.Option(
            metavar="N",
            help="Replace a pool child after it has run N invocations (default: never).",
            min=1,
        ),
    ] = None,
    max_memory_per_child: Annotated[
        float | None,
        typer.Option(
            metavar="MB",
            help="Replace a pool child after an invocation that leaves its resident "
            "memory above MB MiB (default: never).",
            min=1,
        ),
    ] = None,
    async_concurrency: Annotated[
        int,
        typer.Option(
            metavar="N",
            help="async def invocations one pool child runs at once on its event loop.",
            min=1,
            max=10_000,
        ),
    ] = 1,
    exit_after_unreachable: Annotated[
        float | None,
        typer.Option(
            help="Exit when the server has been unreachable this many seconds "
            "(default: keep retrying). Launched daemons use it so none outlive their server.",
            min=1,
        ),
    ] = None,
) -> None:
    """Say hello, claim invocations, run them in a warm pool of child processes, report.

    Pool children start as work arrives (at most --capacity) and each runs many
    invocations one after another, so what a module keeps (a model, a client) stays
    warm for the next, and a @udf(setup=fn) hook runs once per child; async def
    functions run on each child's event loop. A crash, a time-out or a lost lease ends
    only its child's invocation, and the child is replaced. With --runner thread,
    invocations run on the daemon's own threads instead (async def ones on one event
    loop), sharing its memory. On SIGTERM or Ctrl-C it stops claiming, finishes what it
    holds, and exits.
    """
    # here, not at the top: every other command would import the daemon's modules
    from lakeshore.daemon import runner as runner_module
    from lakeshore.daemon.pool import PoolConfig
    from lakeshore.daemon.worker import Daemon, DaemonConfig, DaemonError

    cli = context.get(ctx)
    if runner not in daemon_runners.RUNNERS:
        raise typer.BadParameter(
            f"unknown runner {runner}; available: {', '.join(daemon_runners.RUNNERS)}",
            param_hint="--runner",
        )
    token = cli.token or local_admin_token()
    if not token:
        raise CliError("no token: set --token / LAKESHORE_TOKEN")
    sys.path[:0] = code_path(path)
    for module in preload or []:
        try:
            runner_module.check_preload(module)
        except Exception as exc:  # whatever a module raises at import
            raise CliError(f"cannot preload {module}: {type(exc).__name__}: {exc}") from exc
    logs.setup(log_format.value)
    config = DaemonConfig(
        server=cli.server,
        token=token.strip(),
        queues=queue or [],
        namespace=cli.namespace if cli.namespace != "default" else None,
        capacity=capacity,
        prefetch=prefetch,
        tags=tag or [],
        runner=runner,
        worker_id=worker_id,
        launch_id=launch_id,
        burst=burst,
        grace_s=grace,
        orphan_after_s=exit_after_unreachable,
        pool=PoolConfig(
            preload=tuple(preload or ()),
            max_invocations_per_child=max_invocations_per_child,
            max_memory_per_child_mb=max_memory_per_child,
            async_concurrency=async_concurrency,
        ),
    )
    daemon = Daemon(config)
    if runner == daemon_runners.PROCESS:  # only Lakeshore's code runs in this process
        runtime.tune()  # see lakeshore.runtime
    try:
        on_fastest_loop(daemon.run(own_process=True))
    except DaemonError as exc:
        raise CliError(str(exc)) from exc
    except transport.Unreachable as exc:
        raise CliError(f"cannot reach the Lakeshore server at {cli.server} ({exc})") from exc
    summary = f"daemon stopped: {daemon.completed} succeeded, {daemon.failed} failed"
    if log_format is Format.text:
        output.note(summary)
    else:  # every line a JSON object
        logging.getLogger("lakeshore.daemon").info(summary, extra=logs.ids(worker=daemon.worker_id))
    # all is reported, the children and the sentinel are gone: the interpreter's teardown
    # (~0.1 s of CPU) would only hold the machine, or a --burst drain, a moment longer
    exiting.skip_teardown()


Json = Annotated[bool, typer.Option("--json", help=output.JSON_HELP)]


@verbs.command(app, "create", "launch")
def launch(
    ctx: typer.Context,
    queue: Annotated[str, typer.Option("--queue", "-q", help="The queue the daemons serve.")],
    provider: Annotated[
        str | None,
        typer.Option(help="Provider to launch through (default: the queue's providerRef)."),
    ] = None,
    count: Annotated[int, typer.Option(help="How many daemons.", min=1, max=100)] = 1,
    as_json: Json = False,
) -> None:
    """Launch daemons for a queue through a provider (the fixed policy's tool).

    Each launch counts as in flight until its daemon says hello, as the controller's do."""
    cli = context.get(ctx)
    body: dict[str, object] = {"queue": queue, "count": count}
    if provider:
        body["provider"] = provider
    data = cli.client.request("POST", cli.ns_path("daemons"), json=body)
    if as_json:
        output.data(data)
        return
    failed = [launch for launch in data["launches"] if launch["error"]]
    for launch in data["launches"]:
        state = f"failed: {launch['error']}" if launch["error"] else "launching"
        output.console.print(f"{launch['launchId']}  {state}", markup=False, highlight=False)
    if failed:
        raise typer.Exit(1)


@app.command("list")
def list_(
    ctx: typer.Context,
    queue: Annotated[
        str | None, typer.Option("--queue", "-q", help="Only daemons serving this queue.")
    ] = None,
    as_json: Json = False,
) -> None:
    """List daemons: their queues, capacity, what they run, where they were launched."""
    cli = context.get(ctx)
    data = cli.client.request(
        "GET", cli.ns_path("daemons"), params={"queue": queue} if queue else None
    )
    if as_json:
        output.data(data)
        return
    rows = [
        [
            d["id"],
            ",".join(d["queues"]),
            f"{d['running']}/{d['capacity']}",
            d["provider"] or "",
            "retiring" if d["retiring"] else "",
            d["lastSeenAt"],
            d["runners"],
            d["tags"],
            d["launchId"],
            d["createdAt"],
        ]
        for d in data["daemons"]
    ]
    columns = ["id", "queues", "running", "provider", "", "last seen"]
    output.table([*columns, "runners", "tags", "launch", "created"], rows, wide=4)


@verbs.command(app, "delete", "kill")
def kill(
    ctx: typer.Context,
    worker_id: Annotated[str, typer.Argument(help="Daemon (worker) id.", show_default=False)],
) -> None:
    """Retire an idle daemon: its provider stops it and its id is refused from then on.

    A daemon running invocations is not killed (drain its queue first)."""
    cli = context.get(ctx)
    cli.client.request("DELETE", cli.ns_path("daemons", worker_id))
    output.console.print(f"daemon {worker_id} retired", markup=False, highlight=False)
