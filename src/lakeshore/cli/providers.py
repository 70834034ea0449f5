"""``lakeshore providers``: register where daemons are launched, inspect what was launched."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.text import Text

from lakeshore.cli import context, invocations, output, verbs
from lakeshore.cli.client import CliError

# the kinds a server knows (lakeshore.providers.KINDS, which this must match: a test
# checks), named here so that the CLI starts without importing every provider's client
KIND_NAMES = ("ec2", "fake", "gce", "kube", "local", "slurm", "ssh")

app = typer.Typer(
    help="Create, inspect and delete providers (where the controller launches daemons).",
    no_args_is_help=True,
)

Name = Annotated[str, typer.Argument(help="Provider name.", show_default=False)]
Json = Annotated[bool, typer.Option("--json", help=output.JSON_HELP)]
KindOpt = Annotated[
    str,
    typer.Option(
        "--kind",
        help=f"Provider kind: {', '.join(KIND_NAMES)} (fake records launches and runs "
        "nothing; see docs/providers.md).",
        show_default=False,
    ),
]
ConfigOpt = Annotated[
    str | None,
    typer.Option(
        "--config",
        help="The kind's config as a JSON object, e.g. '{\"launch_ttl_s\": 30}'.",
        show_default=False,
    ),
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="KEY=VALUE",
        help="One config key as KEY=VALUE (repeatable; VALUE is read as JSON, else as "
        "text; applied over --config).",
        show_default=False,
    ),
]


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text  # a bare word is a string: --set fail_launch=boom
    except (ValueError, RecursionError) as exc:  # JSON, but more digits or depth than Python reads
        raise CliError(f"--set: {invocations.unreadable(exc)}") from None


def parse_config(config: str | None, settings: list[str]) -> dict[str, Any]:
    """``--config`` (a JSON object) with each ``--set KEY=VALUE`` applied over it."""
    merged: dict[str, Any] = {}
    if config is not None:
        try:
            loaded = json.loads(config)
        except json.JSONDecodeError as exc:
            raise CliError(
                f"--config is not valid JSON: {exc.msg} (at character {exc.pos})"
            ) from None
        except (ValueError, RecursionError) as exc:
            raise CliError(f"--config: {invocations.unreadable(exc)}") from None
        if not isinstance(loaded, dict):
            raise CliError("--config must be a JSON object, like '{\"launch_ttl_s\": 30}'")
        merged.update(loaded)
    for setting in settings:
        key, sep, value = setting.partition("=")
        if not sep or not key:
            raise CliError(f"--set {setting!r} is not KEY=VALUE")
        merged[key] = _json_value(value)
    return merged


def _said(*parts: str | tuple[str, str]) -> None:
    output.console.print(Text.assemble(*parts))


@verbs.command(app, "create", "add")
def create(
    ctx: typer.Context,
    name: Name,
    kind: KindOpt,
    config: ConfigOpt = None,
    settings: SetOpt = None,
    as_json: Json = False,
) -> None:
    """Register a provider in the namespace.

    Examples:

      lakeshore providers create dry-run --kind fake

      lakeshore providers create flaky --kind fake --set fail_launch="quota exceeded"

      lakeshore providers create hpc --kind slurm --config '{"partition": "gpu"}'
    """
    cli = context.get(ctx)
    body = {"name": name, "kind": kind, "config": parse_config(config, settings or [])}
    created = cli.client.request("POST", cli.ns_path("providers"), json=body)
    if as_json:
        output.data(created)
    else:
        _said("provider ", (created["name"], "bold"), f" ({created['kind']}) registered")


@app.command("list")
def list_(ctx: typer.Context, as_json: Json = False) -> None:
    """List the namespace's providers."""
    cli = context.get(ctx)
    found = cli.client.request("GET", cli.ns_path("providers"))["providers"]
    if as_json:
        output.data(found)
        return
    rows = [
        [p["name"], p["kind"], json.dumps(p["config"], sort_keys=True), p["createdAt"]]
        for p in found
    ]
    output.table(["name", "kind", "config", "created"], rows)


@app.command("show")
def show(ctx: typer.Context, name: Name, as_json: Json = False) -> None:
    """Show one provider: its kind and its config (defaults filled in)."""
    cli = context.get(ctx)
    provider = cli.client.request("GET", cli.ns_path("providers", name))
    if as_json:
        output.data(provider)
    else:
        output.fields(provider, title=f"provider {provider['name']}")


@verbs.command(app, "delete", "remove")
def delete(ctx: typer.Context, name: Name) -> None:
    """Remove a provider (refused while a queue still launches through it)."""
    cli = context.get(ctx)
    removed = cli.client.request("DELETE", cli.ns_path("providers", name))
    _said("provider ", (removed["name"], "bold"), " removed")


@app.command("launches")
def launches(
    ctx: typer.Context,
    name: Name,
    limit: Annotated[int, typer.Option(help="Most launches to show.", min=1, max=1000)] = 50,
    cursor: Annotated[
        str | None,
        typer.Option(help="Continue after an earlier page (its next cursor).", show_default=False),
    ] = None,
    as_json: Json = False,
) -> None:
    """List the launches made through a provider, newest first.

    The fake provider launches nothing: this is where its launch and terminate requests
    can be read.
    """
    cli = context.get(ctx)
    params: dict[str, Any] = {"limit": limit}
    if cursor:
        params["cursor"] = cursor
    page = cli.client.request("GET", cli.ns_path("providers", name, "launches"), params=params)
    rows = page["launches"]
    if as_json:
        output.data(rows)
        return
    output.table(
        [
            *("id", "scope", "state", "worker", "created", "terminated", "error"),
            *("handle", "expires", "resolved"),  # -o wide
        ],
        [
            [
                r["id"],
                r["scope"],
                r["state"],
                r["worker"],
                r["created_at"],
                r["terminated_at"],
                r["error"] or r["terminate_error"],
                r["handle"],
                r["expires_at"],
                r["resolved_at"],
            ]
            for r in rows
        ],
        wide=3,
    )
    if page.get("next_cursor"):
        output.note(f"more: --cursor '{page['next_cursor']}'")
