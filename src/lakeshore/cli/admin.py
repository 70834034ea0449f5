"""``lakeshore namespaces`` and ``lakeshore tokens`` (creating either takes the admin token)."""

from __future__ import annotations

from typing import Annotated

import typer

from lakeshore.cli import context, output

namespaces = typer.Typer(help="Create and list namespaces.", no_args_is_help=True)
tokens = typer.Typer(help="Create namespace tokens.", no_args_is_help=True)

Json = Annotated[bool, typer.Option("--json", help=output.JSON_HELP)]


@namespaces.command("create")
def create_namespace(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Namespace name.", show_default=False)],
    as_json: Json = False,
) -> None:
    """Create a namespace (admin token)."""
    cli = context.get(ctx)
    created = cli.client.request("POST", "/v1/namespaces", json={"name": name})
    if as_json:
        output.print_json(created)
    else:
        output.console.print(f"namespace [bold]{created['name']}[/bold] created")


@namespaces.command("list")
def list_namespaces(ctx: typer.Context, as_json: Json = False) -> None:
    """List the namespaces your token can see."""
    cli = context.get(ctx)
    found = cli.client.request("GET", "/v1/namespaces")["namespaces"]
    if as_json:
        output.print_json(found)
    else:
        output.table(
            ["name", "id", "created"], [[n["name"], n["id"], n["createdAt"]] for n in found]
        )


@tokens.command("create")
def create_token(
    ctx: typer.Context,
    namespace: Annotated[
        str | None,
        typer.Option(
            "--namespace", "-n", help="Namespace the token opens (default: the global one)."
        ),
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="A label for the token.")] = None,
    as_json: Json = False,
) -> None:
    """Create a token for one namespace (admin token). It is shown once; keep it."""
    cli = context.get(ctx)
    ns = namespace or cli.namespace
    body = {"name": name} if name else {}
    issued = cli.client.request("POST", cli.ns_path("tokens", namespace=ns), json=body)
    if as_json:
        output.print_json(issued)
        return
    output.note(f"token for namespace {issued['namespace']} (shown once):")
    print(issued["token"])
