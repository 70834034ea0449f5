"""The global options (``--server``, ``--token``, ``--namespace``/``-n``, ``-o``/``--output``)
accepted after any subcommand as well as before it, as kubectl takes its flags anywhere.

The root callback reads them first (with their environment variables); :func:`install`
then gives every command of the tree the same options, without env vars or defaults, by
wrapping its callback in a function whose signature has them added: typer builds the
command from that signature. A value given after the subcommand replaces the root's, so
the one closest to the command wins. ``-o`` goes only to the commands that print data
(those with ``--json``, which stays as the alias of ``-o json``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from enum import StrEnum
from typing import Annotated, Any

import typer

from lakeshore.cli import context, output

PANEL = "Global options (also before the command)"
SERVER_HELP = "Server URL."
TOKEN_HELP = "API token (default: the local server's admin token, when readable)."
NAMESPACE_HELP = "Namespace."
OUTPUT_HELP = "Output format: json, yaml, or wide (a table with every column)."


class Format(StrEnum):
    json = "json"
    yaml = "yaml"
    wide = "wide"


_SERVER = "global_server"
_TOKEN = "global_token"
_NAMESPACE = "global_namespace"
_OUTPUT = "global_output"

_OPTIONS: dict[str, Any] = {
    _SERVER: Annotated[
        str | None,
        typer.Option("--server", help=SERVER_HELP, rich_help_panel=PANEL, show_default=False),
    ],
    _TOKEN: Annotated[
        str | None,
        typer.Option("--token", help=TOKEN_HELP, rich_help_panel=PANEL, show_default=False),
    ],
    _NAMESPACE: Annotated[
        str | None,
        typer.Option(
            "--namespace", "-n", help=NAMESPACE_HELP, rich_help_panel=PANEL, show_default=False
        ),
    ],
}
_OUTPUT_OPTION: Any = Annotated[
    Format | None,
    typer.Option("--output", "-o", help=OUTPUT_HELP, rich_help_panel=PANEL, show_default=False),
]


def choose_format(chosen: Format | None, as_json: bool) -> Format | None:
    """``--json`` is ``-o json``; with another ``-o`` it is a contradiction."""
    if as_json and chosen not in (None, Format.json):
        raise typer.BadParameter(f"--json is -o json; give one of --json and -o {chosen.value}")
    return Format.json if as_json else chosen


def _with_globals(fn: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(fn, eval_str=True)
    [ctx_name] = [n for n, p in signature.parameters.items() if p.annotation is typer.Context]
    prints_data = "as_json" in signature.parameters
    options = dict(_OPTIONS)
    if prints_data:
        options[_OUTPUT] = _OUTPUT_OPTION
    added = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=hint)
        for name, hint in options.items()
    ]

    @functools.wraps(fn)
    def command(*args: Any, **kwargs: Any) -> Any:
        cli = context.get(kwargs[ctx_name])
        server, token = kwargs.pop(_SERVER), kwargs.pop(_TOKEN)
        namespace = kwargs.pop(_NAMESPACE)
        cli.server = server if server is not None else cli.server
        cli.token = token if token is not None else cli.token
        cli.namespace = namespace if namespace is not None else cli.namespace
        if prints_data:
            given = kwargs.pop(_OUTPUT)
            if given is None and cli.output is not None:
                given = Format(cli.output)
            chosen = choose_format(given, kwargs["as_json"])
            output.use(chosen.value if chosen else None)
            kwargs["as_json"] = chosen in (Format.json, Format.yaml)
        return fn(*args, **kwargs)

    params = [*signature.parameters.values(), *added]
    command.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    return command


def _reads_context(fn: Callable[..., Any]) -> bool:
    parameters = inspect.signature(fn, eval_str=True).parameters.values()
    return any(p.annotation is typer.Context for p in parameters)


def install(app: typer.Typer) -> None:
    """Give every command under ``app`` that reads the CLI context (takes a
    ``typer.Context``) the global options; ``server``, ``up`` and the like take none and
    use none. Call once, after the tree is complete: a command registered later would not
    have them."""
    for info in app.registered_commands:
        if info.callback is not None and _reads_context(info.callback):
            info.callback = _with_globals(info.callback)
    for group in app.registered_groups:
        if group.typer_instance is not None:
            install(group.typer_instance)
