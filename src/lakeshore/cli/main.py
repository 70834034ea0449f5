"""The ``lakeshore`` command."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.text import Text

from lakeshore import __version__
from lakeshore.cli import admin, daemon, feed, invocations, output, providers, queues
from lakeshore.cli.apply_command import apply
from lakeshore.cli.client import CliError
from lakeshore.cli.context import CliContext
from lakeshore.cli.demo import demo
from lakeshore.cli.server import SettingsRefused, server, up
from lakeshore.cli.simulate_command import simulate
from lakeshore.defaults import DEFAULT_URL

app = typer.Typer(
    name="lakeshore",
    help="Lakeshore: elastic queues. Task queues whose worker fleets scale themselves.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        print(f"lakeshore {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    server_url: Annotated[
        str, typer.Option("--server", envvar="LAKESHORE_URL", help="Server URL.")
    ] = DEFAULT_URL,
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            envvar="LAKESHORE_TOKEN",
            help="API token (default: the local server's admin token, when readable).",
            show_default=False,
        ),
    ] = None,
    namespace: Annotated[
        str, typer.Option("--namespace", envvar="LAKESHORE_NAMESPACE", help="Namespace.")
    ] = "default",
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    ctx.obj = CliContext(server=server_url, token=token, namespace=namespace)


app.command("server")(server)
app.command("up")(up)
app.command("demo")(demo)
feed.register(queues.app)
app.add_typer(queues.app, name="queues")
app.add_typer(feed.pools, name="pools")
app.add_typer(feed.controller, name="controller")
app.add_typer(providers.app, name="providers")
app.add_typer(admin.namespaces, name="namespaces")
app.add_typer(admin.tokens, name="tokens")
app.add_typer(daemon.app, name="daemon")
app.add_typer(invocations.app, name="invocations")
app.command("submit")(invocations.submit)
app.command("apply")(apply)
app.command("simulate")(simulate)


def main() -> None:
    try:
        app()
    except SettingsRefused as exc:
        # plain lines, never wrapped: one per refused setting, as a bad flag's exit code
        for line in exc.lines:
            sys.stderr.write(f"lakeshore: {line}\n")
        sys.exit(2)
    except CliError as exc:
        output.errors.print(Text.assemble(("error: ", "bold red"), str(exc)))
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
