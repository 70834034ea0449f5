"""Functions the burst-daemon and daemon-death tests run (imported by daemons by path)."""

from __future__ import annotations

import os
import time
from pathlib import Path


def fails_once(marker: str) -> str:
    """Fail the first time (leaving ``marker`` behind), succeed on the next attempt."""
    path = Path(marker)
    if not path.exists():
        path.write_text("failed once\n", encoding="utf-8")
        raise RuntimeError("the first attempt fails")
    return "second time lucky"


def pid_then_hang(path: str) -> None:
    """Write this process's id to ``path``, then hang (for at most 120 s)."""
    Path(path).write_text(str(os.getpid()), encoding="utf-8")
    time.sleep(120)


def spawn_then_wait(path: str, seconds: float) -> int:
    """Start a grandchild (``sleep 120``, outside Python), write "child grandchild" pids to
    ``path``, then wait ``seconds``; returns the grandchild's pid."""
    import subprocess

    grandchild = subprocess.Popen(["sleep", "120"])
    Path(path).write_text(f"{os.getpid()} {grandchild.pid}", encoding="utf-8")
    time.sleep(seconds)
    return grandchild.pid
