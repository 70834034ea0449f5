"""The runner names a Lakeshore daemon offers (``domain/runners.py``), and refusing others."""

from __future__ import annotations

import pytest

from lakeshore.domain.runners import RUNNERS, require_known, unknown
from lakeshore.errors import InvalidInput


@pytest.mark.parametrize(
    ("names", "missing"),
    [
        ([], []),
        (["process"], []),
        (["process", "process"], []),
        (["gpu", "docker", "process", "docker"], ["docker", "gpu"]),  # sorted, once each
    ],
)
def test_unknown_names_the_runners_a_daemon_does_not_have(
    names: list[str], missing: list[str]
) -> None:
    assert unknown(names) == missing


def test_known_runners_pass() -> None:
    require_known(list(RUNNERS), field="daemonTemplate.runners")


def test_an_unknown_runner_is_refused_naming_the_ones_there_are() -> None:
    with pytest.raises(InvalidInput) as caught:
        require_known(["process", "gpu", "docker"], field="daemonTemplate.runners")
    assert caught.value.field == "daemonTemplate.runners"
    assert caught.value.message == (
        "unknown runner 'docker', 'gpu': a Lakeshore daemon has process"
    )
