"""The server's GC settings, applied in a process of its own (they are process-wide)."""

from __future__ import annotations

import json
import subprocess
import sys

from lakeshore import runtime

PROBE = (
    "import gc, json; from lakeshore import runtime; runtime.tune(); "
    "print(json.dumps([gc.get_threshold(), gc.get_freeze_count()]))"
)


def test_tune_freezes_start_up_and_raises_the_thresholds() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True
    )
    thresholds, frozen = json.loads(done.stdout)
    assert tuple(thresholds) == runtime.GC_THRESHOLDS
    assert frozen > 1_000  # the modules and objects of start-up, out of later collections
