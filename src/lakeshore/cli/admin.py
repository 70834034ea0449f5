"""``lakeshore namespaces`` and ``lakeshore tokens`` (creating either, and listing or
revoking tokens, takes the admin token)."""

from __future__ import annotations

from typing import Annotated

import typer

from lakeshore.cli import context, output, verbs

namespaces = typer.Typer(help="Create and list namespaces.", no_args_is_help=True)
tokens = typer.Typer(
    help="Create, list and delete (revoke) namespace tokens.", no_args_is_help=True
)

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
        output.data(created)
    else:
        output.console.print(f"namespace [bold]{created['name']}[/bold] created")


@namespaces.command("list")
def list_namespaces(ctx: typer.Context, as_json: Json = False) -> None:
    """List the namespaces your token can see."""
    cli = context.get(ctx)
    found = cli.client.request("GET", "/v1/namespaces")["namespaces"]
    if as_json:
        output.data(found)
    else:
        output.table(
            ["name", "id", "created"], [[n["name"], n["id"], n["createdAt"]] for n in found]
        )


@tokens.command("create")
def create_token(
    ctx: typer.Context,
    name: Annotated[str | None, typer.Option("--name", help="A label for the token.")] = None,
    as_json: Json = False,
) -> None:
    """Create a token for the namespace (-n; admin token). It is shown once; keep it."""
    cli = context.get(ctx)
    ns = cli.namespace
    body = {"name": name} if name else {}
    issued = cli.client.request("POST", cli.ns_path("tokens", namespace=ns), json=body)
    if as_json:
        output.data(issued)
        return
    output.note(f"token for namespace {issued['namespace']} (shown once):")
    print(issued["token"])


@tokens.command("list")
def list_tokens(ctx: typer.Context, as_json: Json = False) -> None:
    """List a namespace's tokens, revoked ones included (admin token). Secrets are never
    shown again: a token is known by its id and name."""
    cli = context.get(ctx)
    found = cli.client.request("GET", cli.ns_path("tokens", namespace=cli.namespace))
    if as_json:
        output.data(found["tokens"])
        return
    rows = [
        [t["id"], t["name"] or "", t["createdAt"], t["revokedAt"] or "live"]
        for t in found["tokens"]
    ]
    output.table(["id", "name", "created", "revoked"], rows)


@verbs.command(tokens, "delete", "revoke")
def revoke_token(
    ctx: typer.Context,
    token_ids: Annotated[
        list[str], typer.Argument(metavar="ID...", help="Token ids (lakeshore tokens list).")
    ],
    as_json: Json = False,
) -> None:
    """Revoke tokens (admin token): refused from the next request on (within a second on
    every server). Revoking a revoked token changes nothing."""
    cli = context.get(ctx)
    ns = cli.namespace
    revoked = [
        cli.client.request("DELETE", cli.ns_path("tokens", token_id, namespace=ns))
        for token_id in token_ids
    ]
    if as_json:
        output.data(revoked)
        return
    for token in revoked:
        output.console.print(
            f"token {token['id']} revoked at {token['revokedAt']}", markup=False, highlight=False
        )
