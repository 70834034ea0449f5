"""Calling a UDF inside a pool child: import it, call it, turn what happens into a reply.

A reply is ``("ok", json_text)`` or ``("error", {type, message, traceback, retry})``;
nothing raises. A generator's items, and an async generator's, go to ``emit`` as JSON text
while it runs; its result is its return value (an async generator has none: ``None``).
A result or an item that is not JSON fails without retry: the same code would give the
same result. ``async def`` functions run on the child's event loop (:mod:`.child`); a
plain function that returns a coroutine (a wrapper) has it run to completion too.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
import traceback
from collections.abc import AsyncGenerator, Callable, Coroutine, Generator
from typing import Any

Emit = Callable[[str], None]
Reply = tuple[str, Any]
RunAwaitable = Callable[[Coroutine[Any, Any, Any]], Any]


def resolve(fn: str) -> Any:
    """``package.module:qualname`` → the callable."""
    module_name, _, qualname = fn.partition(":")
    target: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise TypeError(f"{fn} is not callable")
    return target


def prepare(preload: list[str], fn: str) -> Any:
    """Import what is left of ``preload`` (each module taken off the list once imported;
    a failure stays, to be tried again), then resolve ``fn``: its target, or an error
    reply naming what failed."""
    while preload:
        try:
            importlib.import_module(preload[0])
        except Exception as exc:
            return error(exc, prefix=f"--preload {preload[0]} failed: ")
        preload.pop(0)
    try:
        return resolve(fn)
    except ModuleNotFoundError as exc:
        module = fn.partition(":")[0]
        if exc.name is not None and (module == exc.name or module.startswith(exc.name + ".")):
            # the UDF's own module: the next attempt on this daemon would fail the same way
            return error(exc, retry=False, suffix=not_found_hint())
        return error(exc)
    except Exception as exc:
        return error(exc)


def not_found_hint() -> str:
    """What to do when a UDF's module is not on the daemon's path, with that path."""
    shown = [entry for entry in sys.path if entry][:8]
    return (
        f" (the daemon looks for modules in {shown}; start it where the module is, give "
        "`lakeshore daemon run --path DIR`, set LAKESHORE_PATH or PYTHONPATH in the "
        "provider's env, or install the module where the daemon runs)"
    )


def setup_of(target: Any) -> Callable[[], Any] | None:
    """A ``@udf(setup=...)`` hook; only a UDF object has one (its module imported the SDK)."""
    sdk = sys.modules.get("lakeshore.sdk")
    if sdk is None or not isinstance(target, sdk.UDF):
        return None
    hook: Callable[[], Any] | None = target.setup
    return hook


def name_of(hook: Callable[[], Any]) -> str:
    """``module:qualname`` of a set-up hook, for its error message."""
    return f"{getattr(hook, '__module__', '?')}:{getattr(hook, '__qualname__', repr(hook))}"


def is_coroutine(value: Any) -> bool:
    """What ``asyncio.iscoroutine`` says, without importing asyncio in a child that
    runs no coroutine."""
    return isinstance(value, Coroutine)


def is_async(target: Any) -> bool:
    """An ``async def`` function or async generator function (through ``@udf``)."""
    func = inspect.unwrap(target)
    return inspect.iscoroutinefunction(func) or inspect.isasyncgenfunction(func)


def error(exc: BaseException, *, retry: bool = True, prefix: str = "", suffix: str = "") -> Reply:
    return (
        "error",
        {
            "type": type(exc).__name__,
            "message": prefix + str(exc) + suffix,
            "traceback": "".join(traceback.format_exception(exc)),
            "retry": retry,
        },
    )


def _not_json(what: str, exc: Exception) -> Reply:
    return error(TypeError(f"{what} is not JSON-serialisable: {exc}"), retry=False)


def _dumps(value: Any) -> str:
    return json.dumps(value, allow_nan=False)


def _drain(fn: str, generator: Generator[Any, Any, Any], emit: Emit) -> Reply:
    """Send each yielded item as JSON; ('returned', value) at the end, or an error."""
    count = 0
    while True:
        try:
            item = next(generator)
        except StopIteration as stop:
            return "returned", stop.value
        except Exception as exc:
            return error(exc)
        try:
            text = _dumps(item)
        except (TypeError, ValueError) as exc:
            generator.close()
            return _not_json(f"item {count} yielded by {fn}", exc)
        emit(text)
        count += 1


def result_reply(fn: str, result: Any) -> Reply:
    try:
        return "ok", _dumps(result)
    except (TypeError, ValueError) as exc:
        return _not_json(f"the result of {fn}", exc)


def call(
    fn: str,
    target: Any,
    args: list[Any],
    kwargs: dict[str, Any],
    emit: Emit,
    run_awaitable: RunAwaitable,
) -> Reply:
    """Call a plain function (or generator function) on this thread; a coroutine it
    returns (a plain wrapper around an async function) is run by ``run_awaitable``."""
    try:
        result = target(*args, **kwargs)
        if inspect.iscoroutine(result):
            result = run_awaitable(result)
    except Exception as exc:
        return error(exc)
    if inspect.isgenerator(result):
        kind, result = _drain(fn, result, emit)
        if kind == "error":
            return kind, result
    return result_reply(fn, result)


async def _drain_async(fn: str, generator: AsyncGenerator[Any, Any], emit: Emit) -> Reply | None:
    """Send each item an async generator yields; None at its end, or an error reply."""
    count = 0
    async for item in generator:
        try:
            text = _dumps(item)
        except (TypeError, ValueError) as exc:
            await generator.aclose()
            return _not_json(f"item {count} yielded by {fn}", exc)
        emit(text)
        count += 1
    return None


async def call_async(
    fn: str, target: Any, args: list[Any], kwargs: dict[str, Any], emit: Emit
) -> Reply:
    """Await an ``async def`` function, or drain an async generator. Cancellation and
    time-outs (``asyncio.timeout`` around this) pass through."""
    try:
        result = target(*args, **kwargs)
        if inspect.isasyncgen(result):
            failed = await _drain_async(fn, result, emit)
            if failed is not None:
                return failed
            result = None
        elif inspect.isawaitable(result):
            result = await result
    except Exception as exc:  # a cancellation (a time-out, a cancel) is not one
        return error(exc)
    return result_reply(fn, result)
