"""``lakeshore server`` (the API and the elasticity controller) and ``lakeshore up`` (the same
with the ``local`` provider, for one machine)."""

from __future__ import annotations

import contextlib
import enum
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
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
    from lakeshore.api.http_protocol import Limits
    from lakeshore.config import Settings

# The server's own stack (uvicorn, SQLAlchemy, migrations, the app) is imported when a
# server starts, not at every CLI command's start.


class SettingsRefused(CliError):
    """Settings the server will not start with: one line each, ``lakeshore: `` before
    them, exit code 2 (as for a bad flag)."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


def database_url(value: str) -> str:
    """``--db`` takes a URL, or a path to a SQLite file."""
    if "://" in value:
        return value
    return f"sqlite:///{Path(value).expanduser().resolve()}"


Config = Annotated[
    Path | None,
    typer.Option(
        "--config",
        help="A TOML file of settings (default: LAKESHORE_CONFIG); flags and the environment "
        "win over it (docs/configuration.md).",
        show_default=False,
    ),
]
Host = Annotated[
    str | None,
    typer.Option(
        help=f"Address to listen on (LAKESHORE_HOST, default {DEFAULT_HOST}).", show_default=False
    ),
]
Port = Annotated[
    int | None,
    typer.Option(
        help=f"Port to listen on (LAKESHORE_PORT, default {DEFAULT_PORT}).",
        min=0,
        max=65535,
        show_default=False,
    ),
]
LogLevel = Annotated[
    str | None,
    typer.Option(
        help="debug, info, warning or error (LAKESHORE_LOG_LEVEL, default info).",
        show_default=False,
    ),
]
ServerLogFormat = Annotated[
    Format | None,
    typer.Option(
        help="text, or json: one object per line, the ids a line is about as fields "
        "(LAKESHORE_LOG_FORMAT, default text; docs/observability.md).",
        show_default=False,
    ),
]


def server(
    config: Config = None,
    host: Host = None,
    port: Port = None,
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
    log_level: LogLevel = None,
    log_format: ServerLogFormat = None,
) -> None:
    """Run the Lakeshore server: migrates the store, then serves the API and runs the
    elasticity controller until Ctrl-C.

    Each setting comes from its flag, else the environment (LAKESHORE_*), else the TOML
    file that --config or LAKESHORE_CONFIG names, else its default: see
    docs/configuration.md."""
    flags = _flags(
        host=host, port=port, db=db, data_dir=data_dir, log_level=log_level, log_format=log_format
    )
    serve(_settings(config, flags), demo=demo, local_fleet=False)


def up(
    config: Config = None,
    host: Host = None,
    port: Port = None,
    data_dir: Annotated[
        Path | None,
        typer.Option(help="Where the SQLite file, admin token and daemon logs live."),
    ] = None,
    log_level: LogLevel = None,
    log_format: ServerLogFormat = None,
) -> None:
    """Run everything on this machine: the server, the controller and the `local` provider
    (daemons as local processes), on the embedded SQLite store in the data dir unless
    LAKESHORE_DATABASE_URL (or the --config file) names another store. Ctrl-C stops it
    all, launched daemons included.

    Give a queue `--provider local` and an elasticity policy, submit work, and watch the
    fleet grow and shrink: `lakeshore queues events NAME`."""
    flags = _flags(
        host=host, port=port, db=None, data_dir=data_dir, log_level=log_level, log_format=log_format
    )
    serve(_settings(config, flags), demo=False, local_fleet=True)


def _flags(
    *,
    host: str | None,
    port: int | None,
    db: str | None,
    data_dir: Path | None,
    log_level: str | None,
    log_format: Format | None,
) -> dict[str, tuple[str, object]]:
    """The flags given, by their name: (the setting, its value)."""
    given: dict[str, tuple[str, object]] = {}
    if host is not None:
        given["--host"] = ("host", host)
    if port is not None:
        given["--port"] = ("port", port)
    if db:
        given["--db"] = ("database_url", database_url(db))
    if data_dir:
        given["--data-dir"] = ("data_dir", data_dir.expanduser().resolve())
    if log_level is not None:
        given["--log-level"] = ("log_level", log_level)
    if log_format is not None:
        given["--log-format"] = ("log_format", log_format.value)
    return given


def _settings(config: Path | None, flags: dict[str, tuple[str, object]]) -> Settings:
    """The flags over the environment over the file; refused one line per setting."""
    import os

    from pydantic import ValidationError

    from lakeshore import config_errors
    from lakeshore.config import CONFIG_ENV, ConfigFile, ConfigFileError, Settings, config_file
    from lakeshore.errors import LakeshoreError
    from lakeshore.store.engine import parse_url

    chosen = ConfigFile(config, "--config") if config else config_file()
    named = {field: flag for flag, (field, _) in flags.items()}
    try:
        settings = Settings.load(config, **{field: value for field, value in flags.values()})
    except ConfigFileError as exc:
        raise SettingsRefused([str(exc)]) from None
    except ValidationError as exc:
        raise SettingsRefused(config_errors.refusals(exc, named, os.environ, chosen)) from None
    try:
        parse_url(settings.resolved_database_url)
    except LakeshoreError as exc:
        where = config_errors.given_as("database_url", named, os.environ, chosen)
        raise SettingsRefused([f"{where}: {exc.message}"]) from None
    if config is not None:  # the server's own later reads of its settings see the file too
        os.environ[CONFIG_ENV] = str(config.expanduser().resolve())
    if settings.public_url is None:
        host = settings.host
        reachable = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        settings = settings.model_copy(update={"public_url": f"http://{reachable}:{settings.port}"})
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


# uvicorn stops gracefully on SIGINT and SIGTERM (a second SIGINT: at once). A closed
# terminal's SIGHUP and SIGQUIT (Ctrl-\) used to kill the server at once, its claims
# unanswered and `lakeshore up`'s daemons left running: they stop it as SIGTERM does, and
# it exits as after a SIGTERM (uvicorn raises the signal it caught again once stopped; a
# SIGQUIT's own would dump core). SIGUSR1 writes every thread's stack to stderr and the
# server goes on; SIGUSR2 is logged and ignored.
STOPPING_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGHUP", "SIGQUIT") if hasattr(signal, name)
)  # none of these four on Windows


@contextlib.contextmanager
def other_signals(stop: Callable[[int, FrameType | None], None]) -> Iterator[None]:
    """For as long as the server runs: :data:`STOPPING_SIGNALS` call ``stop`` as a SIGTERM
    would, SIGUSR1 dumps the threads' stacks, SIGUSR2 is logged; then as they were."""
    import faulthandler
    import logging

    def stopping(sig: int, frame: FrameType | None) -> None:
        logging.getLogger("lakeshore.server").info(
            "%s: stopping as for SIGTERM", signal.Signals(sig).name
        )
        stop(signal.SIGTERM, frame)

    def ignored(sig: int, frame: FrameType | None) -> None:
        logging.getLogger("lakeshore.server").warning(
            "%s: ignored (SIGTERM, SIGINT, SIGHUP or SIGQUIT stop the server)",
            signal.Signals(sig).name,
        )

    before = {sig: signal.signal(sig, stopping) for sig in STOPPING_SIGNALS}
    usr1, usr2 = getattr(signal, "SIGUSR1", None), getattr(signal, "SIGUSR2", None)
    if usr2 is not None:
        before[usr2] = signal.signal(usr2, ignored)
    if usr1 is not None:
        faulthandler.register(usr1, all_threads=True)
    try:
        yield
    finally:
        if usr1 is not None:
            faulthandler.unregister(usr1)
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _connection_limits(settings: Settings, note: Callable[[str], None]) -> Limits:
    """The deadlines and the cap on connections, the cap from the descriptor limit (raised
    to the hard one) unless set; said at start, and warned of when set over that."""
    import logging

    from lakeshore.api import http_protocol

    descriptors = http_protocol.raise_descriptor_limit()
    fits = http_protocol.connection_cap(descriptors)
    cap = settings.max_connections or fits
    note(
        f"connections: at most {cap} (descriptor limit {descriptors}); request headers "
        f"within {settings.header_timeout_s:g} s, bodies within {settings.body_timeout_s:g} s"
    )
    if cap > fits:
        logging.getLogger("lakeshore.server").warning(
            "max_connections %d is over the %d that the descriptor limit %d leaves room for: "
            "when the connections fill it, the store and the files may find no descriptor",
            cap,
            fits,
            descriptors,
        )
    return http_protocol.Limits(settings.header_timeout_s, settings.body_timeout_s, cap)


def serve(settings: Settings, *, demo: bool, local_fleet: bool) -> None:
    import logging
    import socket

    import uvicorn
    from sqlalchemy.exc import DBAPIError
    from uvicorn.config import STARTUP_FAILURE

    from lakeshore import logs, runtime
    from lakeshore.api import http_protocol
    from lakeshore.api.app import begin_stopping, create_app
    from lakeshore.store.engine import parse_url, prepare

    url = parse_url(settings.resolved_database_url)  # checked in _settings
    shown = url.render_as_string(hide_password=True)
    try:
        prepare(url)  # migrate before serving, so a bad store is one clear line, not a trace
    except (DBAPIError, OSError) as exc:
        reason = getattr(exc, "orig", None) or exc
        raise CliError(f"cannot open the store at {shown}: {reason}".strip()) from exc
    host, port, log_level, log_format = (
        settings.host,
        settings.port,
        settings.log_level,
        settings.log_format,
    )
    logs.setup(log_format, log_level)
    # the start-up lines: on the terminal as they are, or as log lines in json
    note = output.note if log_format == "text" else logging.getLogger("lakeshore.server").info
    token_path = _admin_token_file(settings)
    note(f"lakeshore server on http://{host}:{port}  (API docs: /docs)")
    note(f"store: {shown}")
    if token_path:
        note(f"admin token: {token_path}")
    else:
        note("admin token: from the settings (LAKESHORE_ADMIN_TOKEN or admin_token)")
    if demo:
        note(
            'demo queue "demo" (fully_elastic, 0-4 daemons); in another terminal: '
            "lakeshore queues show demo"
        )
    if local_fleet:
        note(f"local provider: daemons run here, logs in {settings.data_dir / 'daemons'}")
    limits = _connection_limits(settings, note)
    app = create_app(settings, demo=demo, local_fleet=local_fleet)
    runtime.tune()  # see lakeshore.runtime: full collections stalled the loop in ticks

    class Server(uvicorn.Server):
        """uvicorn's, telling the app first when it begins to stop (see begin_stopping),
        and stopping gracefully on the signals of :data:`STOPPING_SIGNALS` too."""

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            await begin_stopping(app)
            await super().shutdown(sockets)

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            with super().capture_signals(), other_signals(self.handle_exit):
                yield

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        log_config=logs.config(log_format, log_level),  # uvicorn's lines in the same format
        lifespan="on",
        # httptools parses requests in C (a dependency), with read deadlines and a cap on
        # connections (lakeshore.api.http_protocol); the loop is uvloop where it is
        # installed (not on Windows), else asyncio's
        http=http_protocol.protocol_class(limits),
        loop="auto",
        # X-Forwarded-Proto and -For are believed from these peers only (a TLS proxy's
        # https makes the dashboard's cookies Secure and its Origin check pass)
        proxy_headers=True,
        forwarded_allow_ips=settings.forwarded_allow_ips,
    )
    server = Server(config)
    with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C: stopped at once
        server.run()
    if not server.started:  # it could not start (the port is taken, say): as uvicorn.run
        raise SystemExit(STARTUP_FAILURE)
