"""The ``schedules:`` section of ``lakeshore.yaml``: checked with the file, then planned
against what the server has (create, update only the fields given, unchanged)."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from lakeshore.cli.apply_file import ApplyFile, FileInvalid, load
from lakeshore.cli.apply_plan import ServerState, make_plan

FILE = """
queues:
  - name: reports
schedules:
  - queue: reports
    name: nightly
    cron: "0 3 * * *"
    timezone: Europe/Paris
    fn: jobs.reports:nightly
    kwargs: {full: true}
  - queue: reports
    name: beat
    every_s: 30
    fn: jobs.reports:beat
    catch_up: all
"""


def parse(text: str) -> ApplyFile:
    return load(textwrap.dedent(text), "lakeshore.yaml")


def on_server(name: str, **fields: Any) -> dict[str, Any]:
    base = {"name": name, "cron": None, "every_s": None, "args": [], "kwargs": {}}
    base.update({"timezone": "UTC", "catch_up": "one", "enabled": True, "queue": "reports"})
    return {**base, **fields}


def state(*schedules: dict[str, Any]) -> ServerState:
    queues = {"reports": {"name": "reports", "kind": "fifo", "state": "active"}}
    return ServerState({}, queues, {}, {("reports", s["name"]): s for s in schedules})


NIGHTLY = on_server(
    "nightly",
    cron="0 3 * * *",
    timezone="Europe/Paris",
    fn="jobs.reports:nightly",
    kwargs={"full": True},
)
BEAT = on_server("beat", every_s=30, fn="jobs.reports:beat", catch_up="all")


def test_missing_schedules_are_created_after_their_queue() -> None:
    plan = make_plan(parse(FILE), ServerState({}, {}, {}), "default")
    assert not plan.problems
    assert [step.text for step in plan.steps] == [
        "+ queue reports (fifo, fixed)",
        "+ schedule reports/nightly (cron 0 3 * * *, jobs.reports:nightly)",
        "+ schedule reports/beat (every 30s, jobs.reports:beat)",
    ]
    create = plan.steps[1].calls[0]
    assert (create.method, create.segments) == ("POST", ("queues", "reports", "schedules"))
    assert create.body["timezone"] == "Europe/Paris" and "every_s" not in create.body


def test_matching_schedules_are_unchanged_even_when_paused_by_hand() -> None:
    paused = {**BEAT, "enabled": False}
    plan = make_plan(parse(FILE), state(NIGHTLY, paused), "default")
    assert [step.action for step in plan.steps] == ["unchanged", "unchanged", "unchanged"]


def test_a_changed_field_is_patched_alone_and_cron_replaces_every_s() -> None:
    edited = FILE.replace('cron: "0 3 * * *"', 'cron: "0 4 * * *"').replace(
        "every_s: 30", 'cron: "*/30 * * * * *"'
    )
    plan = make_plan(parse(edited), state(NIGHTLY, BEAT), "default")
    updates = [step for step in plan.steps if step.action == "update"]
    assert [step.text for step in updates] == [
        '~ schedule reports/nightly: cron "0 3 * * *" → "0 4 * * *"',
        '~ schedule reports/beat: cron (unset) → "*/30 * * * * *", every_s 30 → (unset)',
    ]
    assert updates[0].calls[0].body == {"cron": "0 4 * * *"}
    assert updates[1].calls[0].body == {"cron": "*/30 * * * * *"}
    assert updates[1].calls[0].segments == ("queues", "reports", "schedules", "beat")


def test_a_schedule_on_an_unknown_queue_is_a_problem_with_its_line() -> None:
    text = FILE.replace("queues:\n  - name: reports\n", "")
    plan = make_plan(parse(text), ServerState({}, {}, {}), "default")
    first, second = (problem.render("f") for problem in plan.problems)
    assert first.startswith('f:3: schedules[0].queue: queue "reports" is neither declared')
    assert second.startswith("f:9: schedules[1].queue: ")


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (('cron: "0 3 * * *"', 'cron: "0 25 * * *"'), "lakeshore.yaml:7: schedules[0].cron: "),
        (("Europe/Paris", "Europe/Nowhere"), "lakeshore.yaml:8: schedules[0].timezone: "),
        (("every_s: 30", "every_s: 0"), "lakeshore.yaml:13: schedules[1].every_s: "),
        (("name: beat", "name: nightly"), "lakeshore.yaml:12: schedules[1].name: "),
        (
            ("  - queue: reports\n    name: beat", "  - name: beat"),
            "lakeshore.yaml:11: schedules[1].queue: this field is required",
        ),
    ],
)
def test_a_bad_schedule_names_its_line_and_field(change: tuple[str, str], expected: str) -> None:
    with pytest.raises(FileInvalid) as caught:
        parse(FILE.replace(*change))
    assert caught.value.messages()[0].startswith(expected), caught.value.messages()
