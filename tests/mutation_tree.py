"""What ``make mutate`` copies of the tree, and which files a unit test read outside it.

mutmut runs the unit tests in a copy of the tree (``mutants/``): ``[tool.mutmut]``'s
``source_paths`` and ``also_copy``, and what mutmut always copies (``tests/``,
``pyproject.toml`` …). A unit test that reads a file of the tree left out of that copy
passes here and fails there, before any mutant: the baseline run ends with ``failed to
collect stats`` and ``make mutate`` with nothing. ``tests/unit/conftest.py`` records the
files each unit test opens for reading (an audit hook, :func:`recording`) and fails the
test that read one :func:`uncopied` names.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import tomllib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# copied by mutmut whatever the configuration says (mutmut.configuration, 3.x)
ALWAYS = ("tests", "test", "setup.cfg", "pyproject.toml", "uv.lock", "poetry.lock")
ALWAYS += ("Pipfile.lock", "pdm.lock")
# made by tools as tests run, never part of the tree a test means to read
NOT_THE_TREE = {"__pycache__", ".git", ".hypothesis", ".pytest_cache", ".mypy_cache"}
NOT_THE_TREE |= {".ruff_cache", "mutants"}


@functools.cache
def copied_paths(root: Path = ROOT) -> tuple[str, ...]:
    """The paths (relative to ``root``) whose files ``make mutate`` copies."""
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["mutmut"]
    top_tests = tuple(p.name for p in root.glob("test*.py"))
    return (*config.get("source_paths", []), *config.get("also_copy", []), *ALWAYS, *top_tests)


def uncopied(read: Iterable[str], copied: Iterable[str], root: Path = ROOT) -> list[str]:
    """The files of the tree among ``read`` (absolute paths) that no ``copied`` path
    holds, relative to ``root``, sorted."""
    prefixes = [Path(c).parts for c in copied]
    environment = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()}
    missing = set()
    for name in read:
        path = Path(name)
        try:
            parts = path.relative_to(root).parts
        except ValueError:
            continue  # not the tree's: a temporary directory, the interpreter's files
        if not parts or NOT_THE_TREE & set(parts) or not path.is_file():
            continue
        if any(p == path or p in path.parents for p in environment):
            continue  # the virtual environment, when it sits in the tree (.venv)
        if not any(parts[: len(prefix)] == prefix for prefix in prefixes):
            missing.add(Path(*parts).as_posix())
    return sorted(missing)


_lock = threading.Lock()
_reads: list[str] | None = None
_hooked = False


def _opened(event: str, args: tuple[object, ...]) -> None:
    if event != "open" or _reads is None:
        return
    path, mode, flags = args
    if not isinstance(path, str | bytes | os.PathLike):
        return  # a file descriptor
    reading = (
        not any(c in mode for c in "wax+")
        if isinstance(mode, str)
        else isinstance(flags, int) and flags & os.O_ACCMODE == os.O_RDONLY
    )
    if reading:
        _reads.append(os.path.abspath(os.fsdecode(path)))


@contextmanager
def recording() -> Iterator[list[str]]:
    """The absolute paths of the files opened for reading meanwhile (by any thread of
    this process)."""
    global _reads, _hooked
    with _lock:
        if not _hooked:  # an audit hook stays for the life of the process: one
            sys.addaudithook(_opened)
            _hooked = True
    reads: list[str] = []
    outer, _reads = _reads, reads
    try:
        yield reads
    finally:
        _reads = outer
