"""Every unit test reads only files that ``make mutate`` copies into its tree (see
:mod:`tests.mutation_tree`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests import mutation_tree


@pytest.fixture(autouse=True)
def _reads_only_what_make_mutate_copies() -> Iterator[None]:
    with mutation_tree.recording() as reads:
        yield
    missing = mutation_tree.uncopied(reads, mutation_tree.copied_paths())
    if missing:
        pytest.fail(
            f"this test reads {', '.join(missing)}, which `make mutate` does not copy "
            "into its tree: add it to also_copy in [tool.mutmut] (pyproject.toml)",
            pytrace=False,
        )
