"""Every CLI command starts by importing the CLI: it must not load the server's stack,
nor the daemon's own clients (only ``lakeshore daemon run`` needs them)."""

from __future__ import annotations

import subprocess
import sys

from lakeshore.cli.providers import KIND_NAMES
from lakeshore.providers import KINDS

SERVER_ONLY = ("sqlalchemy", "alembic", "uvicorn", "fastapi", "pydantic_settings", "boto3")
DAEMON_ONLY = ("lakeshore.daemon.worker", "lakeshore.daemon.pool")


def test_the_cli_starts_without_the_server_stack_or_the_daemons_clients() -> None:
    probe = (
        "import sys, lakeshore.cli.main; "
        f"print(','.join(m for m in {(*SERVER_ONLY, *DAEMON_ONLY)!r} if m in sys.modules))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()
    assert loaded == ""


def test_the_cli_names_every_provider_kind_the_server_knows() -> None:
    assert tuple(sorted(KINDS)) == KIND_NAMES
