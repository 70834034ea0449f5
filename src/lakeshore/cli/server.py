"""``lakeshore server`` (the API and the elasticity controller) and ``lakeshore up`` (the same
with the ``local`` provider, for one machine)."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from lakeshore.cli import output
from lakeshore.cli.client import CliError
from lakeshore.defaults import DEFAULT_HOST, DEFAULT_PORT


class Format(enum.StrEnum):
    text = "text"
    json = "json"


LogFormat = Annotated[
    Format,
    typer.Option(
        envvar="LAKESHORE_LOG_FORMAT",
        help="text, or json: one object per line, the ids a line is about as fields "
        "(docs/observability.md).",
    ),
]

if TYPE_CHECKING:
    from pydantic import ValidationError

    from lakeshore.config import Settings

# The server's own stack (uvicorn, SQLAlchemy, migrations, the app) is imported when a
# server starts, not at every CLI command's start.


def database_url(value: str) -> str:
    """``--db`` takes a URL, or a path to a SQLite file."""
    if "://" in value:
        return value
    return f"sqlite:///{Path(value).expanduser().resolve()}"


def settings_refused(exc: ValidationError) -> str:
    """The settings a server refuses to start with, on one line; never the values given
    (one of them may be a token)."""
    problems = []
    for error in exc.errors(include_url=False, include_input=False):
        where = ".".join(str(part) for part in error["loc"])
        message = str(error["msg"]).removeprefix("Value error, ")
        problems.append(f"{where}: {message}" if where else message)
    return "invalid settings: " + "; ".join(problems)


def server(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = DEFAULT_HOST,
    port: Annotated[int, typer.Option(help="Port to listen on.", min=0, max=65535)] = DEFAULT_PORT,
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            help="Database: postgresql://… or a SQLite file path "
            "(default: LAKESHORE_DATABASE_URL, else lakeshore.db in the data dir).",
        ),
    ] = None,
    data_dir: Annotated[
        Path | None,
        typer.Option(help="Where the SQLite file and admin token live (LAKESHORE_DATA_DIR)."),
    ] = None,
    demo: Annotated[
        bool, typer.Option("--demo", help="Create a demo queue on start, for a first look.")
    ] = False,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    log_format: LogFormat = Format.text,
) -> None:
    """Run the Lakeshore server: migrates the store, then serves the API and runs the
    elasticity controller until Ctrl-C."""
    serve(
        host,
        port,
        db,
        data_dir,
        demo=demo,
        log_level=log_level,
        log_format=log_format.value,
        local_fleet=False,
    )


def up(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = DEFAULT_HOST,
    port: Annotated[int, typer.Option(help="Port to listen on.", min=0, max=65535)] = DEFAULT_PORT,
    data_dir: Annotated[
        Path | None,
        typer.Option(help="Where the SQLite file, admin token and daemon logs live."),
    ] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    log_format: LogFormat = Format.text,
) -> None:
    """Run everything on this machine: the server, the controller and the `local` provider
    (daemons as local processes), on the embedded SQLite store in the data dir unless
    LAKESHORE_DATABASE_URL names another store. Ctrl-C stops it all, launched daemons
    included.

    Give a queue `--provider local` and an elasticity policy, submit work, and watch the
    fleet grow and shrink: `lakeshore queues events NAME`."""
    serve(
        host,
        port,
        None,
        data_dir,
        demo=False,
        log_level=log_level,
        log_format=log_format.value,
        local_fleet=True,
    )


def _settings(host: str, port: int, db: str | None, data_dir: Path | None) -> Settings:
    """The environment's settings with the flags over them; refused in one line."""
    from pydantic import ValidationError

    from lakeshore.config import Settings

    overrides: dict[str, object] = {}
    if db:
        overrides["database_url"] = database_url(db)
    if data_dir:
        overrides["data_dir"] = data_dir.expanduser().resolve()
    try:
        settings = Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        raise CliError(settings_refused(exc)) from None
    if settings.public_url is None:
        reachable = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        settings = settings.model_copy(update={"public_url": f"http://{reachable}:{port}"})
    return settings


def _admin_token_file(settings: Settings) -> Path | None:
    """Where the admin token lives (``None``: the setting), made if missing."""
    from lakeshore.errors import LakeshoreError
    from lakeshore.services.auth import load_or_create_admin_token

    try:
        _, path = load_or_create_admin_token(settings.admin_token, settings.admin_token_path)
    except OSError as exc:
        raise CliError(f"cannot write the admin token file: {exc}") from exc
    except LakeshoreError as exc:
        raise CliError(exc.message) from exc
    return path


def serve(
    host: str,
    port: int,
    db: str | None,
    data_dir: Path | None,
    *,
    demo: bool,
    log_level: str,
    local_fleet: bool,
    log_format: str = "text",
) -> None:
    import logging

    import uvicorn
    from sqlalchemy.exc import DBAPIError

    from lakeshore import logs, runtime
    from lakeshore.api.app import create_app
    from lakeshore.errors import LakeshoreError
    from lakeshore.store.engine import parse_url, prepare

    settings = _settings(host, port, db, data_dir)
    try:
        url = parse_url(settings.resolved_database_url)
    except LakeshoreError as exc:
        raise typer.BadParameter(exc.message, param_hint="--db") from exc
    shown = url.render_as_string(hide_password=True)
    try:
        prepare(url)  # migrate before serving, so a bad store is one clear line, not a trace
    except (DBAPIError, OSError) as exc:
        reason = getattr(exc, "orig", None) or exc
        raise CliError(f"cannot open the store at {shown}: {reason}".strip()) from exc
    logs.setup(log_format, log_level)
    # the start-up lines: on the terminal as they are, or as log lines in json
    note = output.note if log_format == "text" else logging.getLogger("lakeshore.server").info
    token_path = _admin_token_file(settings)
    note(f"lakeshore server on http://{host}:{port}  (API docs: /docs)")
    note(f"store: {shown}")
    if token_path:
        note(f"admin token: {token_path}")
    else:
        note("admin token: from LAKESHORE_ADMIN_TOKEN")
    if demo:
        note(
            'demo queue "demo" (fully_elastic, 0-4 daemons); in another terminal: '
            "lakeshore queues show demo"
        )
    if local_fleet:
        note(f"local provider: daemons run here, logs in {settings.data_dir / 'daemons'}")
    app = create_app(settings, demo=demo, local_fleet=local_fleet)
    runtime.tune()  # see lakeshore.runtime: full collections stalled the loop in ticks
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level=log_level,
        log_config=logs.config(log_format, log_level),  # uvicorn's lines in the same format
        lifespan="on",
    )
