"""A function that records its own run: the limits' real-process tests read when each
invocation began and ended (``tests/acceptance/test_limits.py``)."""

from __future__ import annotations

import os
import time


def span(path: str, tag: str, seconds: float) -> str:
    """Append ``TAG START END`` (``time.time()`` as the body begins and ends) after
    sleeping ``seconds``; one ``write(2)`` on an ``O_APPEND`` descriptor, so lines from
    processes running at once never interleave."""
    began = time.time()
    time.sleep(seconds)
    line = f"{tag} {began:.6f} {time.time():.6f}\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    return tag
