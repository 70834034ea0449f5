"""The console script ends without the interpreter's teardown when a command asks, with
its output flushed and its exit code kept."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from lakeshore.cli import exiting

# the console script, with an atexit handler that shows whether the teardown ran
SCRIPT = """
import atexit, sys
atexit.register(lambda: print("teardown ran", flush=True))
from lakeshore.cli import exiting, main
if sys.argv[1] == "skip":
    exiting.skip_teardown()
sys.argv = ["lakeshore", *sys.argv[2:]]
main.main()
"""


def run_script(home: Path, skip: bool, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home)}
    # a port of the test's own, bound and never listening: a connection there is refused
    with socket.socket() as nobody:
        nobody.bind(("127.0.0.1", 0))
        return subprocess.run(
            [sys.executable, "-c", SCRIPT, "skip" if skip else "keep", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={**env, "LAKESHORE_URL": f"http://127.0.0.1:{nobody.getsockname()[1]}"},
        )


def test_a_command_that_asks_ends_without_the_teardown_its_output_written(
    tmp_path: Path,
) -> None:
    skipped, kept = (
        run_script(tmp_path, True, "--version"),
        run_script(tmp_path, False, "--version"),
    )
    assert (skipped.returncode, kept.returncode) == (0, 0)
    assert skipped.stdout.startswith("lakeshore ") and "teardown ran" not in skipped.stdout
    assert kept.stdout.startswith("lakeshore ") and "teardown ran" in kept.stdout


def test_the_exit_code_of_a_failure_is_kept(tmp_path: Path) -> None:
    failed = run_script(tmp_path, True, "queues", "list")
    assert failed.returncode == 1
    assert "cannot reach the Lakeshore server" in failed.stderr
    assert "teardown ran" not in failed.stdout


@pytest.mark.parametrize(
    ("code", "expected", "printed"),
    [(None, 0, ""), (0, 0, ""), (3, 3, ""), ("went wrong", 1, "went wrong\n")],
)
def test_the_exit_code_is_the_one_the_interpreter_would_give(
    code: object, expected: int, printed: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert exiting.code_of(SystemExit(code)) == expected
    assert capsys.readouterr().err == printed
