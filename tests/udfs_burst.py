"""Functions the burst-daemon tests run (imported by daemons by path)."""

from __future__ import annotations

from pathlib import Path


def fails_once(marker: str) -> str:
    """Fail the first time (leaving ``marker`` behind), succeed on the next attempt."""
    path = Path(marker)
    if not path.exists():
        path.write_text("failed once\n", encoding="utf-8")
        raise RuntimeError("the first attempt fails")
    return "second time lucky"
