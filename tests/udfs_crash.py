"""Functions the crash-cost tests run (imported by daemons by path)."""

from __future__ import annotations

import time
from pathlib import Path


def hold_once(marker: str, seconds: float, value: int) -> int:
    """The first run leaves ``marker`` behind and holds its slot for ``seconds`` (long
    enough for its daemon to be killed in it); a later run returns ``value`` at once."""
    path = Path(marker)
    if not path.exists():
        path.write_text("began\n", encoding="utf-8")
        time.sleep(seconds)
    return value
