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


@pytest.mark.parametrize("names", [[], ["process"], ["thread"], ["thread", "thread"]])
def test_one_known_runner_passes(names: list[str]) -> None:
    require_known(names, field="daemonTemplate.runners")


def test_two_runners_are_refused_a_daemon_runs_with_one() -> None:
    with pytest.raises(InvalidInput) as caught:
        require_known(list(RUNNERS), field="daemonTemplate.runners")
    assert caught.value.field == "daemonTemplate.runners"
    assert caught.value.message == (
        "a Lakeshore daemon runs with one runner, not process, thread: name one (queues "
        "that need another get daemons of their own)"
    )


def test_an_unknown_runner_is_refused_naming_the_ones_there_are() -> None:
    with pytest.raises(InvalidInput) as caught:
        require_known(["process", "gpu", "docker"], field="daemonTemplate.runners")
    assert caught.value.field == "daemonTemplate.runners"
    assert caught.value.message == (
        "unknown runner 'docker', 'gpu': a Lakeshore daemon has process, thread"
    )
