"""The loop a daemon runs on: uvloop where it is installed, else asyncio's own."""

from __future__ import annotations

import asyncio
import sys

import pytest

from lakeshore.cli.daemon import on_fastest_loop


async def loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_a_daemon_runs_on_uvloop_where_it_is_installed() -> None:
    pytest.importorskip("uvloop")  # not on Windows
    assert on_fastest_loop(loop_module()).startswith("uvloop")


def test_without_uvloop_a_daemon_runs_on_asyncio_s_own_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop raises ImportError
    assert on_fastest_loop(loop_module()).startswith("asyncio")
