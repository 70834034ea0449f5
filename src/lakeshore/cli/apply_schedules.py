"""The ``schedules:`` section of ``lakeshore.yaml``: each item a queue's periodic schedule.

    schedules:
      - queue: reports
        name: nightly
        cron: "0 3 * * *"
        timezone: Europe/Paris
        fn: jobs.reports:nightly

Checked with the file by the server's own rules (:func:`lakeshore.domain.schedules.parse`).
A missing schedule is created; one whose fields differ from the file's is PATCHed with
those fields (giving ``cron`` drops the server's ``every_s`` and the other way round);
fields the file does not set (``enabled``, say, after a ``lakeshore schedules pause``) are
left alone, and a schedule absent from the file is never deleted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lakeshore.domain import schedules as rules
from lakeshore.errors import InvalidInput

if TYPE_CHECKING:
    from lakeshore.cli.apply_file import ApplyFile, Located, Problem
    from lakeshore.cli.apply_plan import ServerState, Step


@dataclass(frozen=True)
class ScheduleDecl:
    queue: str
    spec: rules.ScheduleSpec
    given: dict[str, Any]  # the fields the file sets, normalized
    index: int
    line: int

    @property
    def name(self) -> str:
        """``queue/name``: a schedule's name is its queue's."""
        return f"{self.queue}/{self.spec.name}"


def parse_decl(doc: Located, index: int, raw: dict[str, Any]) -> ScheduleDecl:
    """One ``schedules:`` item; raises the file's problems (see ``apply_file``)."""
    from lakeshore.cli.apply_file import _invalid_input_problem, _Many

    path = ("schedules", index)
    queue = raw.get("queue")
    if not isinstance(queue, str) or not queue:
        raise _Many(
            [
                doc.problem(
                    (*path, "queue"), "this field is required: the queue the schedule submits to"
                )
            ]
        )
    body = {key: value for key, value in raw.items() if key != "queue"}
    try:
        spec = rules.parse(body)
    except InvalidInput as exc:
        raise _Many([_invalid_input_problem(doc, path, exc)]) from None
    written = spec.to_json()
    given = {key: written.get(key) for key in body}
    if "cron" in body:
        given["every_s"] = None
    if "every_s" in body:
        given["cron"] = None
    return ScheduleDecl(queue, spec, given, index, doc.line_of(path))


def _when(spec: rules.ScheduleSpec) -> str:
    return f"cron {spec.cron}" if spec.cron is not None else f"every {spec.every_s:g}s"


def plan_schedule(file: ApplyFile, decl: ScheduleDecl, state: ServerState) -> Step | Problem:
    from lakeshore.cli.apply_plan import Call, Step, _fields_json, _fields_text, field_changes

    name = decl.name
    if decl.queue not in state.queues and file.queue(decl.queue) is None:
        return file.problem(
            ("schedules", decl.index, "queue"),
            f'queue "{decl.queue}" is neither declared in this file nor on the server',
        )
    segments = ("queues", decl.queue, "schedules")
    current = state.schedules.get((decl.queue, decl.spec.name))
    if current is None:
        body = {k: v for k, v in decl.spec.to_json().items() if v is not None}
        text = f"+ schedule {name} ({_when(decl.spec)}, {decl.spec.fn})"
        return Step("create", "schedule", name, text, [Call("POST", segments, body)])
    changes: list[tuple[str, Any, Any]] = []
    patch: dict[str, Any] = {}
    for key, value in decl.given.items():
        differ = field_changes(current.get(key), value, key)
        if differ:
            changes += differ
            if value is not None:  # a null is the other of cron / every_s, dropped by it
                patch[key] = value
    if not changes:
        return Step("unchanged", "schedule", name, f"= schedule {name} (unchanged)")
    call = Call("PATCH", (*segments, decl.spec.name), patch)
    text = f"~ schedule {name}: {_fields_text(changes)}"
    return Step("update", "schedule", name, text, [call], {"fields": _fields_json(changes)})
