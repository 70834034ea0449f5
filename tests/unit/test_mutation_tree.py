"""``make mutate``'s copy of the tree holds every file the unit tests read: the check
that fails a unit test reading one it leaves out (``tests/unit/conftest.py``)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from tests import mutation_tree
from tests.mutation_tree import ROOT, copied_paths, uncopied

DOC = ROOT / "docs" / "configuration.md"
EXAMPLE = ROOT / "lakeshore.yaml"


def test_the_files_the_unit_tests_read_are_in_make_mutates_tree() -> None:
    read = [str(DOC), str(EXAMPLE), str(ROOT / "src" / "lakeshore" / "errors.py")]
    assert uncopied(read, copied_paths()) == []


def test_a_file_of_the_tree_left_out_of_the_copy_is_named() -> None:
    read = [str(DOC), str(EXAMPLE), str(ROOT / "tests" / "conftest.py")]
    before_the_fix = ["src", "lakeshore.yaml", *mutation_tree.ALWAYS]
    assert uncopied(read, before_the_fix) == ["docs/configuration.md"]


def test_files_outside_the_tree_and_tools_caches_are_not_the_trees(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch.txt"
    scratch.write_text("x")
    cache = ROOT / ".pytest_cache" / "README.md"
    assert uncopied([str(scratch), str(cache), str(ROOT / "gone.md")], ["src"]) == []


def test_reads_are_recorded_from_every_thread_and_writes_are_not(tmp_path: Path) -> None:
    written = tmp_path / "written.txt"
    with mutation_tree.recording() as reads:
        DOC.read_text()
        written.write_text("x")
        reader = threading.Thread(target=EXAMPLE.read_bytes)
        reader.start()
        reader.join()
        os.close(os.open(ROOT / "pyproject.toml", os.O_RDONLY))

    assert {str(DOC), str(EXAMPLE), str(ROOT / "pyproject.toml")} <= set(reads)
    assert str(written) not in reads
