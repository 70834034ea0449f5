"""Running one invocation in a child process, so a crash or a hang stays contained.

The child is forked (about 5 ms on Linux, the daemon's imports already loaded), imports
``fn``, calls it, and sends back a JSON result or the error. A generator function's items
are sent one by one as it yields them (handed to ``on_item`` in the parent), and its
result is the generator's return value. The parent waits at most ``timeout_s`` in all and
kills the child after that. Exceptions, import errors, results or items that are not JSON
and children that die are all reported as an :class:`Outcome`; nothing raises.

Each child leads a process group of its own, killed as its invocation ends (a result, a
time-out, a lost lease, a crash), so a process the UDF started does not outlive it. On
Linux the child is killed by the kernel when the daemon dies (even by SIGKILL), and the
daemon's :mod:`.sentinel` kills the groups of what was running, so nothing a UDF started
outlives the daemon that ran it.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import multiprocessing
import os
import threading
import time
import traceback
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from lakeshore.daemon import linux
from lakeshore.daemon.sentinel import Sentinel, kill_group

Emit = Callable[[str], None]


@dataclass(frozen=True)
class Outcome:
    ok: bool
    result: Any = None
    error: dict[str, Any] = field(default_factory=dict)
    retry: bool = True


def resolve(fn: str) -> Any:
    """``package.module:qualname`` → the callable."""
    module_name, _, qualname = fn.partition(":")
    target: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise TypeError(f"{fn} is not callable")
    return target


def preload(module: str) -> None:
    """Import ``module`` in the daemon itself, before any invocation runs: children are
    forked from the daemon, so each inherits it already imported (``--preload``)."""
    if (
        not module
        or module.startswith(".")
        or not all(part.isidentifier() for part in module.split("."))
    ):
        raise ValueError(f"{module!r} is not a module name (e.g. mypackage.models)")
    importlib.import_module(module)


def _error(exc: BaseException, *, retry: bool = True) -> tuple[str, dict[str, Any]]:
    return (
        "error",
        {
            "type": type(exc).__name__,
            "message": str(exc),
            "traceback": "".join(traceback.format_exception(exc)),
            "retry": retry,
        },
    )


def _not_json(what: str, exc: Exception) -> tuple[str, dict[str, Any]]:
    return _error(TypeError(f"{what} is not JSON-serialisable: {exc}"), retry=False)


def _drain(fn: str, generator: Generator[Any, Any, Any], emit: Emit) -> tuple[str, Any]:
    """Send each yielded item as JSON; ('returned', value) at the end, or an error."""
    count = 0
    while True:
        try:
            item = next(generator)
        except StopIteration as stop:
            return "returned", stop.value
        except Exception as exc:
            return _error(exc)
        try:
            text = json.dumps(item, allow_nan=False)
        except (TypeError, ValueError) as exc:
            generator.close()
            return _not_json(f"item {count} yielded by {fn}", exc)
        emit(text)
        count += 1


def call(
    fn: str, args: list[Any], kwargs: dict[str, Any], emit: Emit | None = None
) -> tuple[str, Any]:
    """Import and call; the reply is ('ok', json_text) or ('error', error dict). A
    generator's items go to ``emit`` as JSON text while it runs."""
    try:
        target = resolve(fn)
    except Exception as exc:
        return _error(exc)
    try:
        result = target(*args, **kwargs)
    except Exception as exc:
        return _error(exc)
    if inspect.isgenerator(result):
        kind, result = _drain(fn, result, emit or (lambda _text: None))
        if kind == "error":
            return kind, result
    try:
        return "ok", json.dumps(result, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return _not_json(f"the result of {fn}", exc)


def _child(
    conn: Connection,
    parent_pid: int,
    close_fd: int | None,
    fn: str,
    args: list[Any],
    kwargs: dict[str, Any],
) -> None:
    os.setsid()  # a process group of its own: whatever the UDF starts is killed with it
    if close_fd is not None:  # the sentinel's stdin stays the daemon's alone
        with contextlib.suppress(OSError):
            os.close(close_fd)
    linux.die_with_parent(parent_pid)
    try:
        conn.send(call(fn, args, kwargs, lambda text: conn.send(("item", text))))
    finally:
        conn.close()
        os._exit(0)  # skip the parent's atexit handlers and buffered state


def _reap_group(pgid: int, within_s: float = 2.0) -> None:
    """Wait for the killed members of a group that were re-parented to this process (a
    subreaper), so none is left a zombie; those that are not its children are init's."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if os.waitid(os.P_PGID, pgid, os.WEXITED | os.WNOHANG) is None:
                time.sleep(0.005)  # members still dying (SIGKILL is on its way)
        except ChildProcessError:
            return


def _context() -> Any:
    # fork: ~5 ms a child, with the daemon's imports already loaded. The fork server
    # costs ~0.5 s a child here (each re-prepares the entry point), too slow per call.
    return multiprocessing.get_context("fork")


def _receive(
    receiver: Connection, timeout_s: float | None, on_item: Callable[[Any], None] | None
) -> tuple[str, Any]:
    """The child's final reply, handing items on as they come; or timeout / died."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not receiver.poll(remaining):
                return "timeout", None
            kind, payload = receiver.recv()
            if kind != "item":
                return kind, payload
            if on_item is not None:
                on_item(json.loads(payload))
    except EOFError:
        return "died", None


_FORK = threading.Lock()  # one fork at a time: see Run.start


class Run:
    """One invocation's child process: ``start`` forks it, ``wait`` blocks until its
    outcome (call it from a thread), ``kill`` ends it early from any thread (a lease that
    was lost, a daemon stopping) so nothing keeps running for an invocation this daemon
    no longer holds."""

    def __init__(
        self,
        fn: str,
        args: list[Any],
        kwargs: dict[str, Any],
        timeout_s: float | None,
        on_item: Callable[[Any], None] | None = None,
        sentinel: Sentinel | None = None,
    ) -> None:
        self.fn, self.timeout_s, self.on_item = fn, timeout_s, on_item
        self._args = (fn, args, kwargs)
        self._sentinel = sentinel
        self._child: Any = None
        self._killed = False

    def start(self) -> None:
        """Fork the child. Forks are serialised with the pipe's creation and the parent
        closing its copy of the child's end: a child forked by another thread in between
        would inherit that end, and a crash of this child would go unseen (no EOF) until
        that other child exited too."""
        context = _context()
        with _FORK:
            receiver, sender = context.Pipe(duplex=False)
            close_fd = self._sentinel.stdin_fd if self._sentinel else None
            child = context.Process(
                target=_child, args=(sender, os.getpid(), close_fd, *self._args), daemon=True
            )
            child.start()
            sender.close()
        if self._sentinel is not None:
            self._sentinel.add(child.pid)
        self._receiver, self._child = receiver, child
        if self._killed:
            self.kill()

    def kill(self) -> None:
        self._killed = True
        if self._child is not None and self._child.exitcode is None:
            kill_group(self._child.pid)
            with contextlib.suppress(OSError):  # not yet a group leader
                self._child.kill()

    def wait(self) -> Outcome:
        child, fn, timeout_s = self._child, self.fn, self.timeout_s
        try:
            kind, payload = _receive(self._receiver, timeout_s, self.on_item)
        finally:
            self._receiver.close()
        # whatever the outcome, nothing the UDF started outlives it: the group goes while
        # its leader is unreaped (its id cannot have been reused), then the leader is
        # reaped, then the rest of the group that was handed to this process
        kill_group(child.pid)
        child.join(5)
        _reap_group(child.pid)
        if self._sentinel is not None:
            self._sentinel.discard(child.pid)
        if kind == "ok":
            return Outcome(ok=True, result=json.loads(payload))
        if kind == "error":
            retry = bool(payload.pop("retry", True))
            return Outcome(ok=False, error=payload, retry=retry)
        if kind == "timeout":
            message = f"{fn} ran past its timeout of {timeout_s} s"
            return Outcome(ok=False, error={"type": "TimeoutError", "message": message})
        if self._killed:
            message = f"the process running {fn} was stopped by the daemon"
            return Outcome(ok=False, error={"type": "Stopped", "message": message})
        code = child.exitcode
        message = f"the process running {fn} died (exit code {code})"
        return Outcome(ok=False, error={"type": "WorkerCrash", "message": message})

    def __call__(self) -> Outcome:
        """Start and wait (blocking; call it from a thread)."""
        self.start()
        return self.wait()


def run(
    fn: str,
    args: list[Any],
    kwargs: dict[str, Any],
    timeout_s: float | None,
    on_item: Callable[[Any], None] | None = None,
) -> Outcome:
    """Run one invocation in a child process (blocking; call it from a thread)."""
    return Run(fn, args, kwargs, timeout_s, on_item)()
