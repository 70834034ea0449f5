"""The runners a Lakeshore daemon offers — the ways it can run an invocation — in one place.

``lakeshore daemon run --runner`` takes one of these, a worker's hello announces it (a
queue's ``match.runners`` is matched against it), and a queue whose daemons Lakeshore
launches may name only one of these in its ``daemonTemplate``: a launched daemon asked
for a runner it does not have would exit at start, and the controller would launch again
and again (on EC2 or GCE, a machine each time).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from lakeshore.errors import InvalidInput

PROCESS: Final = "process"  # a warm pool of child processes (daemon/pool.py)
THREAD: Final = "thread"  # threads of the daemon itself (daemon/threads.py)
RUNNERS: Final = (PROCESS, THREAD)


def unknown(names: Sequence[str]) -> list[str]:
    """The names in ``names`` that are not runners of a Lakeshore daemon."""
    return sorted(set(names) - set(RUNNERS))


def require_known(names: Sequence[str], *, field: str) -> None:
    """422 for a runner a Lakeshore daemon does not have, naming the ones it has, and for
    more than one: a Lakeshore daemon runs all its invocations with one runner."""
    missing = unknown(names)
    if missing:
        raise InvalidInput(
            f"unknown runner {', '.join(repr(n) for n in missing)}: a Lakeshore daemon "
            f"has {', '.join(RUNNERS)}",
            field=field,
        )
    if len(set(names)) > 1:
        raise InvalidInput(
            f"a Lakeshore daemon runs with one runner, not {', '.join(sorted(set(names)))}: "
            "name one (queues that need another get daemons of their own)",
            field=field,
        )
