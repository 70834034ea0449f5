"""The exit code the console script ends with when it skips the interpreter's teardown."""

from __future__ import annotations

import pytest

from lakeshore.cli import exiting


@pytest.mark.parametrize(
    ("code", "expected", "printed"),
    [(None, 0, ""), (0, 0, ""), (3, 3, ""), ("went wrong", 1, "went wrong\n")],
)
def test_the_exit_code_is_the_one_the_interpreter_would_give(
    code: object, expected: int, printed: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert exiting.code_of(SystemExit(code)) == expected
    assert capsys.readouterr().err == printed


def test_nothing_is_requested_until_a_command_asks() -> None:
    assert not exiting.requested()
