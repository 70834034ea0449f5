"""How the server's and a daemon's processes run their garbage collector.

CPython's default thresholds (700, 10, 10) run a full collection whenever the objects
that survived young collections since the last one pass a quarter of the old ones. A
controller tick over 10,000 queues keeps a few hundred thousand objects alive while it
runs (the plan's steps, the outcomes, the rows), so the default made two or three full
collections per tick, each walking every object the process holds — 80 to 120 ms with
the event loop (which serves the API) stopped, the longest stalls a tick caused.

:func:`tune` makes young collections rarer and larger (a collection of 100,000 young
objects takes ~20 ms) and full collections rare (after 50 times 100 young ones), and
freezes what start-up made (modules, schemas, the app) out of every later collection.
Reference counting still frees nearly everything at once; only cyclic garbage waits
longer for a collection.

A daemon with the ``process`` runner (its UDFs run in pool children, which keep Python's
defaults) tunes itself the same way: each invocation leaves a task, futures and dicts
behind, and young collections kept walking them (two daemons drained 10,000 no-ops 4 to 9 %
faster tuned, three rounds alternating). With the ``thread`` runner the UDFs run in the
daemon, and their cyclic garbage must not wait: the defaults stay.
"""

from __future__ import annotations

import gc
from typing import Final

GC_THRESHOLDS: Final = (100_000, 50, 100)


def tune() -> None:
    """Freeze start-up's objects and set :data:`GC_THRESHOLDS` (call once, at start)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
