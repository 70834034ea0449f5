"""The README's quick start in Python runs exactly as written: its blocks are read from
README.md, not copied here, so a README edited out of working order fails this test.

In a fresh directory: the module the README says to save (the ``python`` block defining
``@udf(queue="gpu-train")``, under the file name the text before it gives), the real
``lakeshore up`` started there, the queue created with the README's own
``lakeshore queues create gpu-train ...`` line through the real CLI, then the README's
``python -c ...`` line run there with the venv's python; it prints 49.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

from tests.acceptance.conftest import CLI_TIMEOUT_S, LAKESHORE, WIDE, clean_env
from tests.acceptance.test_up_and_local import ROOT, lakeshore_up

pytestmark = pytest.mark.acceptance

README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
UDF_MARK = '@udf(queue="gpu-train")'
QUEUE_ADD = "lakeshore queues create gpu-train"
T = TypeVar("T")


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    before: str  # the README's text between the previous block and this one


def blocks(text: str) -> list[Block]:
    """The README's fenced code blocks, in order."""
    found, end = [], 0
    for match in FENCE.finditer(text):
        found.append(Block(match[1], match[2], text[end : match.start()]))
        end = match.end()
    return found


def command_lines(block: Block, prefix: str) -> list[list[str]]:
    """A shell block's command lines (continuations joined) that start with ``prefix``,
    each split as the shell would, its comment dropped."""
    if block.lang != "bash":
        return []
    lines = block.code.replace("\\\n", " ").splitlines()
    return [shlex.split(line, comments=True) for line in lines if line.startswith(prefix)]


def the_one(found: list[T], what: str) -> T:
    assert len(found) == 1, f"the README should have exactly one {what}, found {found}"
    return found[0]


def test_the_readme_python_quick_start_prints_49(tmp_path: Path) -> None:
    readme = blocks(README.read_text())
    at = readme.index(the_one([b for b in readme if UDF_MARK in b.code], "UDF module block"))
    module = readme[at]
    assert module.lang == "python"
    named = re.findall(r"`(\w+\.py)`", module.before)
    assert named, f"the text before the UDF block should name its file: {module.before!r}"
    after = next((b for b in readme[at + 1 :] if b.lang == "bash"), None)
    assert after is not None, "a shell block should follow the UDF block"
    snippet = the_one(command_lines(after, "python "), "python command after the UDF block")
    queue_add = the_one(
        [line for b in readme for line in command_lines(b, QUEUE_ADD)], f"`{QUEUE_ADD}` line"
    )
    (tmp_path / named[-1]).write_text(module.code)

    with lakeshore_up(tmp_path) as up:
        token = (up.data_dir / "admin-token").read_text().strip()
        env = clean_env(LAKESHORE_URL=up.url, LAKESHORE_TOKEN=token, COLUMNS=WIDE)
        env.pop("PYTHONPATH", None)  # the README's user has none
        made = subprocess.run(
            [str(LAKESHORE), *queue_add[1:]], cwd=tmp_path, env=env,
            capture_output=True, text=True, timeout=CLI_TIMEOUT_S,
        )  # fmt: skip
        assert made.returncode == 0, made.stdout + made.stderr
        ran = subprocess.run(
            [sys.executable, *snippet[1:]], cwd=tmp_path, env=env,
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert ran.stdout.strip() == "49", ran.stdout + ran.stderr
