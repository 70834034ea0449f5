"""Where a local Lakeshore lives, without the server's settings machinery: the default
address and data dir, and the embedded server's admin token (the SDK and the CLI read
these; importing them must stay cheap, since every CLI command starts with it)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

import platformdirs

DIST_NAME: Final = "lakeshore-queues"  # the distribution's name on the package index
DEFAULT_HOST: Final = "127.0.0.1"
DEFAULT_PORT: Final = 8270
DEFAULT_URL: Final = f"http://{DEFAULT_HOST}:{DEFAULT_PORT}"
ADMIN_TOKEN_FILE: Final = "admin-token"
ADMIN_TOKEN_MIN_CHARS: Final = 16  # a shorter admin token is refused at start


def default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("lakeshore", appauthor=False))


def read_local_admin_token() -> str | None:
    """The embedded server's admin token, when this user can read it (local use only)."""
    data_dir = Path(os.environ.get("LAKESHORE_DATA_DIR") or default_data_dir())
    try:
        token = (data_dir / ADMIN_TOKEN_FILE).read_text().strip()
    except OSError:
        return None
    return token or None
