"""The ``lakeshore`` command."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from lakeshore import __version__
from lakeshore.cli import (
    admin,
    daemon,
    exiting,
    feed,
    global_options,
    help_text,
    invocation_actions,
    invocations,
    output,
    providers,
    queues,
    schedules,
)
from lakeshore.cli.apply_command import apply
from lakeshore.cli.client import CliError
from lakeshore.cli.context import CliContext
from lakeshore.cli.demo import demo
from lakeshore.cli.server import SettingsRefused, server, up
from lakeshore.cli.simulate_command import simulate
from lakeshore.defaults import DEFAULT_URL, DIST_NAME

app = typer.Typer(
    name="lakeshore",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        print(f"lakeshore {__version__} ({DIST_NAME} on the package index)")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    server_url: Annotated[
        str,
        typer.Option("--server", envvar="LAKESHORE_URL", help=global_options.SERVER_HELP),
    ] = DEFAULT_URL,
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            envvar="LAKESHORE_TOKEN",
            help=global_options.TOKEN_HELP,
            show_default=False,
        ),
    ] = None,
    namespace: Annotated[
        str,
        typer.Option(
            "--namespace",
            "-n",
            envvar="LAKESHORE_NAMESPACE",
            help=global_options.NAMESPACE_HELP,
        ),
    ] = "default",
    output_format: Annotated[
        global_options.Format | None,
        typer.Option(
            "--output",
            "-o",
            help=global_options.OUTPUT_HELP + " For the commands that print data.",
            show_default=False,
        ),
    ] = None,
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """Lakeshore: elastic queues. Task queues whose worker fleets scale themselves.
    --server, --token, --namespace (-n) and --output (-o) go before the command or after
    it; given in both places, the one after it wins; a flag beats its environment variable.
    """
    fmt = output_format.value if output_format else None
    output.use(fmt)
    ctx.obj = CliContext(server=server_url, token=token, namespace=namespace, output=fmt)


app.command("server")(server)
app.command("up")(up)
app.command("demo")(demo)
feed.register(queues.app)
app.add_typer(queues.app, name="queues")
app.add_typer(schedules.app, name="schedules")
app.add_typer(feed.pools, name="pools")
app.add_typer(feed.controller, name="controller")
app.add_typer(providers.app, name="providers")
app.add_typer(admin.namespaces, name="namespaces")
app.add_typer(admin.tokens, name="tokens")
app.add_typer(daemon.app, name="daemon")
invocation_actions.register(invocations.app)
app.add_typer(invocations.app, name="invocations")
app.command("submit")(invocations.submit)
app.command("apply")(apply)
app.command("simulate")(simulate)
global_options.install(app)
help_text.install(app)


def main() -> None:
    """The console script: the app, then (when the command asked for it) an end without
    the interpreter's teardown (:mod:`.exiting`)."""
    try:
        _run_app()
    except SystemExit as exc:
        if exiting.requested():
            exiting.now(exiting.code_of(exc))
        raise
    if exiting.requested():
        exiting.now(0)


def _run_app() -> None:
    try:
        app()
    except SettingsRefused as exc:
        # plain lines, never wrapped: one per refused setting, as a bad flag's exit code
        for line in exc.lines:
            sys.stderr.write(f"lakeshore: {line}\n")
        sys.exit(2)
    except CliError as exc:
        output.failure(str(exc))
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
