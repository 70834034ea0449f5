"""A UDF for the delayed-submit acceptance test: when its body began, by this machine's
clock (the server's, on the same machine)."""

from __future__ import annotations

import time


def began() -> float:
    return time.time()
