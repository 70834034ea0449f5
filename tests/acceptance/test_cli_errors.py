"""Every ``lakeshore`` command, given bad input, fails with a short message and no
traceback: an unknown option, a missing argument, a value of the wrong type, a server that
is not there, a wrong token.

The commands are found by walking the CLI's command tree, so a new command is covered by
itself. Only the commands that run until stopped (``server``, ``up``, ``demo``, ``daemon
run``, which waits for its server to come back) are left out of the cases that reach a
server. The runs of one case go a few at a time; the CLI's behaviour does not depend on
the store, so one SQLite server serves the module.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import typer.main

from lakeshore.cli.main import app
from tests.acceptance.conftest import Cli, LakeshoreServer, Result, free_port, running_server

pytestmark = pytest.mark.acceptance

RUN_UNTIL_STOPPED = {("server",), ("up",), ("demo",), ("daemon", "run")}
MOST_STDERR_LINES = 8  # a usage error's box is a few lines; a traceback is many more
PARALLEL = 4


def _leaves(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    subcommands = getattr(command, "commands", None)
    if not subcommands:
        yield path, command
        return
    for name, sub in sorted(subcommands.items()):
        if not sub.hidden:  # an alias runs the same function as its command
            yield from _leaves(sub, (*path, name))


LEAVES = list(_leaves(typer.main.get_command(app)))


def _ids(leaves: list[tuple[tuple[str, ...], Any]]) -> list[tuple[str, ...]]:
    return [path for path, _ in leaves]


def _filled(command: Any) -> list[str]:
    """Placeholder values for the command's required parameters."""
    args: list[str] = []
    for param in command.params:
        if param.required:
            args += [param.opts[0], "x"] if param.opts[0].startswith("-") else ["x"]
    return args


def _is_number(param: Any) -> bool:
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return any(arg in (int, float) for arg in typing.get_args(annotation))
    return annotation in (int, float)


def _number_option(command: Any) -> str | None:
    for param in command.params:
        if _is_number(param) and param.opts[0].startswith("--"):
            return str(param.opts[0])
    return None


def _takes_server(command: Any) -> bool:
    return any("--server" in param.opts for param in command.params)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LakeshoreServer]:
    base = tmp_path_factory.mktemp("errors")
    with running_server("sqlite", str(base / "l.db"), base / "data", base / "s.log") as srv:
        yield srv


@pytest.fixture
def offline(tmp_path: Path) -> Cli:
    return Cli(f"http://127.0.0.1:{free_port()}", "lks_0000000000000000_x", tmp_path)


def run_all(cli: Cli, runs: list[list[str]]) -> list[tuple[list[str], Result]]:
    with ThreadPoolExecutor(PARALLEL) as pool:
        return list(zip(runs, pool.map(lambda args: cli.run(*args), runs), strict=True))


def assert_clean(results: list[tuple[list[str], Result]], *, code: int | None = None) -> None:
    """Each failed (with ``code`` when given) with a short message and no traceback."""
    assert results
    unclean = [
        (" ".join(args), result)
        for args, result in results
        if result.returncode == 0
        or (code is not None and result.returncode != code)
        or "Traceback" in result.stdout + result.stderr
        or not result.stderr.strip()
        or len(result.stderr.strip().splitlines()) > MOST_STDERR_LINES
    ]
    assert not unclean, "\n\n".join(f"$ lakeshore {args}\n{result}" for args, result in unclean)


def test_the_tree_walk_finds_every_command_group() -> None:
    groups = {path[0] for path in _ids(LEAVES)}
    assert {"queues", "invocations", "providers", "daemon", "tokens", "namespaces"} <= groups
    assert ("invocations", "retry") in _ids(LEAVES)


def test_an_unknown_option_is_a_usage_error_for_every_command(offline: Cli) -> None:
    runs = [[*path, *_filled(command), "--no-such-option"] for path, command in LEAVES]
    results = run_all(offline, runs)
    assert_clean(results, code=2)
    assert all("--no-such-option" in result.message for _, result in results)


def test_a_missing_argument_is_a_usage_error_for_every_command(offline: Cli) -> None:
    runs = [list(path) for path, command in LEAVES if _filled(command)]
    assert_clean(run_all(offline, runs), code=2)


def test_a_value_of_the_wrong_type_is_a_usage_error(offline: Cli) -> None:
    runs = []
    for path, command in LEAVES:
        option = _number_option(command)
        if option is not None:
            runs.append([*path, *_filled(command), option, "not-a-number"])
    assert len(runs) >= 5
    assert_clean(run_all(offline, runs), code=2)


def test_a_server_that_is_not_there_is_one_message_for_every_command(offline: Cli) -> None:
    runs = [
        [*path, *_filled(command), "--server", offline.url]
        for path, command in LEAVES
        if _takes_server(command) and path not in RUN_UNTIL_STOPPED
    ]
    assert_clean(run_all(offline, runs))


def test_a_wrong_token_is_one_message_for_every_command(
    live: LakeshoreServer, tmp_path: Path
) -> None:
    cli = Cli(live.url, "lks_0000000000000000_not-the-secret", tmp_path)
    runs = [
        [*path, *_filled(command)]
        for path, command in LEAVES
        if _takes_server(command) and path not in RUN_UNTIL_STOPPED
    ]
    assert_clean(run_all(cli, runs))
