"""Ending the ``lakeshore`` process without the interpreter's teardown.

A command whose work is done and reported may ask for it (:func:`skip_teardown`): the
console script's ``main`` then flushes the logs and the standard streams and ends the
process at once (``os._exit``) instead of letting Python finalise its modules one by
one. For ``lakeshore daemon run`` that teardown was ~0.1 s of CPU after the daemon's
last invocation was reported, its children stopped and its goodbye said: time a
``--burst`` daemon held its machine for nothing, and a drain of a queue waited for.
Nothing is left for it to release then that the kernel does not (sockets, memory,
threads with no work); the pool children end the same way.

Only the console script acts on the request: a command run in-process (a test's
``CliRunner``) leaves its interpreter alone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import NoReturn

_requested = False


def skip_teardown() -> None:
    """Ask ``main`` to end the process without the interpreter's teardown."""
    global _requested
    _requested = True


def requested() -> bool:
    return _requested


def now(code: int) -> NoReturn:
    """Flush what is buffered and end the process with ``code``."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def code_of(exit: SystemExit) -> int:
    """The process's exit code for ``exit``, as the interpreter would make it (a message
    given instead of a code is printed, and the code is 1)."""
    if exit.code is None:
        return 0
    if isinstance(exit.code, int):
        return exit.code
    with contextlib.suppress(Exception):
        sys.stderr.write(f"{exit.code}\n")
    return 1
