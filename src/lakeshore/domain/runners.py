"""The runners a Lakeshore daemon offers — the ways it can run an invocation — in one place.

``lakeshore daemon run --runner`` takes these, a worker's hello announces them (work
``match.runners`` is matched against them), and a queue whose daemons Lakeshore launches
may name only these in its ``daemonTemplate``: a launched daemon asked for a runner it
does not have would exit at start, and the controller would launch again and again (on
EC2 or GCE, a machine each time).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from lakeshore.errors import InvalidInput

RUNNERS: Final = ("process",)  # process: each invocation in a child process


def unknown(names: Sequence[str]) -> list[str]:
    """The names in ``names`` that are not runners of a Lakeshore daemon."""
    return sorted(set(names) - set(RUNNERS))


def require_known(names: Sequence[str], *, field: str) -> None:
    """422 for a runner a Lakeshore daemon does not have, naming the ones it has."""
    missing = unknown(names)
    if missing:
        raise InvalidInput(
            f"unknown runner {', '.join(repr(n) for n in missing)}: a Lakeshore daemon "
            f"has {', '.join(RUNNERS)}",
            field=field,
        )
