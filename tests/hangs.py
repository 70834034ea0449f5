"""What a hung test was waiting for: every running event loop's tasks, awaited chain and all.

pytest-timeout (``timeout`` in ``pyproject.toml``) fails a test that runs past its limit
and prints every thread's stack; for async code that shows only an event loop idle in
``select``. A moment before the limit, :func:`arm` prints each task's chain of awaits
(coroutine by coroutine, down to the future it waits on), which is what tells a lost
wake-up from a swallowed cancellation.
"""

from __future__ import annotations

import asyncio
import gc
import io
import sys
import threading
import types
from collections.abc import Iterator
from contextlib import contextmanager


def _awaits(task: asyncio.Task[object], out: io.StringIO) -> None:
    print(repr(task)[:400], file=out)
    step: object = task.get_coro()
    while step is not None:
        frame = getattr(step, "cr_frame", None) or getattr(step, "ag_frame", None)
        frame = frame or getattr(step, "gi_frame", None)
        if isinstance(frame, types.FrameType):
            code = frame.f_code
            print(f"    {code.co_filename}:{frame.f_lineno} {code.co_name}", file=out)
        nxt = getattr(step, "cr_await", None) or getattr(step, "ag_await", None)
        nxt = nxt or getattr(step, "gi_yieldfrom", None)
        if nxt is not None and frame is None:
            print(f"    awaiting {nxt!r:.300}", file=out)
            return
        step = nxt


def dump_tasks(title: str) -> None:
    """Print the tasks of every running event loop (called from another thread)."""
    loops = [
        o for o in gc.get_objects() if isinstance(o, asyncio.AbstractEventLoop) and o.is_running()
    ]
    for loop in loops:

        def dump(loop: asyncio.AbstractEventLoop = loop) -> None:
            out = io.StringIO()
            print(f"\n{'+' * 20} asyncio tasks of {title} {'+' * 20}", file=out)
            for task in asyncio.all_tasks(loop):
                _awaits(task, out)
            sys.__stderr__.write(out.getvalue())
            sys.__stderr__.flush()

        loop.call_soon_threadsafe(dump)


@contextmanager
def arm(title: str, after_s: float) -> Iterator[None]:
    """Dump the tasks if the block is still running after ``after_s``."""
    timer = threading.Timer(after_s, dump_tasks, args=(title,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
