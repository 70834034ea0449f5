"""``lakeshore apply -f lakeshore.yaml``: make a namespace match a file, and say what changed.

Three steps, kept apart so the middle one is a pure function of values:

1. **gather** what the server has: providers, queues (archived ones too), and for each
   compose entry the queue's daemons (retiring ones left out) and launches in flight;
2. **plan**: compare. Missing providers and queues are created; a queue's fields that differ
   are PATCHed (only those, each nested object whole, as PATCH replaces it); fields the file
   does not set are left alone; nothing absent from the file is ever deleted. A compose
   entry launches or retires daemons until ``daemons + in flight == count``. Anything that
   cannot be applied becomes a problem naming the file's line, and nothing is sent;
3. **execute** the plan's calls in order: providers, queues, schedules, then compose.

Providers have no PATCH. A provider whose kind or config differs is *replaced* (DELETE, then
POST) when no queue on the server names it; when one does, the plan refuses with a message
saying which queues, since deleting it would be refused by the server anyway and the queues
would launch through nothing in between.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, NoReturn

import typer
from rich.text import Text

from lakeshore.cli import context, output
from lakeshore.cli.apply_file import (
    ApplyFile,
    FileInvalid,
    Problem,
    load,
)
from lakeshore.cli.apply_plan import (
    CHANGES,
    Fleet,
    Plan,
    ServerState,
    Step,
    make_plan,
    plural,
)
from lakeshore.cli.client import CliError
from lakeshore.cli.context import CliContext

_STYLES: Final = {"+": "green", "~": "yellow", "-": "red", "!": "bold yellow", "=": "dim"}


def gather(cli: CliContext, namespace: str, file: ApplyFile) -> ServerState:
    """What the namespace holds now, as far as the file is concerned."""

    def get(*segments: str, params: dict[str, Any] | None = None) -> Any:
        return cli.client.request("GET", cli.ns_path(*segments, namespace=namespace), params=params)

    providers = {p["name"]: p for p in get("providers")["providers"]}
    listed = cli.client.every_page(  # every page: a queue missed would be created again
        cli.ns_path("queues", namespace=namespace), "queues", params={"include_archived": "true"}
    )
    queues = {q["name"]: q for q in listed}
    fleets = {}
    for entry in file.daemons:
        if entry.queue in queues:
            daemons = get("daemons", params={"queue": entry.queue})["daemons"]
            stats = get("queues", entry.queue, "stats")
            serving = tuple(d for d in daemons if not d.get("retiring"))
            fleets[entry.queue] = Fleet(serving, int(stats.get("inFlight") or 0))
    schedules = {}
    for queue in sorted({decl.queue for decl in file.schedules} & set(queues)):
        for found in get("queues", queue, "schedules")["schedules"]:
            schedules[(queue, found["name"])] = found
    return ServerState(providers, queues, fleets, schedules)


def _busy(exc: CliError) -> bool:
    """A refused retire because the daemon took work since the plan (409)."""
    return exc.status == 409


def _run(cli: CliContext, namespace: str, step: Step) -> None:
    failures: list[str] = []
    for call in step.calls:
        path = cli.ns_path(*call.segments, namespace=namespace)
        answer = cli.client.request(call.method, path, json=call.body)
        if step.action == "launch":
            launches = answer.get("launches", [])
            step.detail.setdefault("launches", []).extend(x["launchId"] for x in launches)
            failures += [str(x["error"]) for x in launches if x.get("error")]
    if failures:
        step.status = "failed"
        step.error = f"{len(failures)} launch(es) failed: {failures[0]}"
    else:
        step.status = "done"


def execute(cli: CliContext, namespace: str, plan: Plan, on_step: Callable[[Step], None]) -> bool:
    """Carry out the plan in order; True when everything was applied.

    A provider or queue that fails stops the run (what follows may depend on it); a launch
    or retire that fails is reported and the rest goes on."""
    ok = True
    for number, step in enumerate(plan.steps):
        if not step.calls:
            step.status = "unchanged" if step.action == "unchanged" else "skipped"
            on_step(step)
            continue
        try:
            _run(cli, namespace, step)
        except CliError as exc:
            step.error = str(exc)
            step.status = "skipped" if step.action == "retire" and _busy(exc) else "failed"
        ok = ok and step.status != "failed"
        on_step(step)
        if step.status == "failed" and step.type in ("provider", "queue"):
            for rest in plan.steps[number + 1 :]:
                rest.status = "not applied"
            return False
    return ok


# --- the command -----------------------------------------------------------------------


def read_file(path: str) -> tuple[str, str]:
    """The file's text and the name to report it by (``-`` is standard input)."""
    if path == "-":
        return sys.stdin.read(), "<stdin>"
    try:
        return Path(path).read_text(encoding="utf-8"), path
    except UnicodeDecodeError:
        raise CliError(f"{path}: not UTF-8 text") from None
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from None


def _namespace(ctx: typer.Context, cli: CliContext, file: ApplyFile) -> str:
    if file.namespace is None:
        return cli.namespace
    # by name: typer ships its own copy of click, whose enum is private to it
    source = ctx.find_root().get_parameter_source("namespace")
    given = getattr(source, "name", None) in ("COMMANDLINE", "ENVIRONMENT")
    if given and cli.namespace != file.namespace:
        problem = file.problem(
            ("namespace",),
            f'the file says "{file.namespace}" but --namespace / LAKESHORE_NAMESPACE says '
            f'"{cli.namespace}"; drop one of them',
        )
        raise FileInvalid(file.label, [problem])
    return file.namespace


def _print_step(step: Step) -> None:
    line = Text(step.text, style=_STYLES.get(step.text[:1], ""))
    output.console.print(line, soft_wrap=True)
    if step.error is not None:
        word = "skipped" if step.status == "skipped" else "failed"
        output.note(f"  {word}: {step.error}")


def _summary(plan: Plan, dry_run: bool) -> str:
    changes = sum(1 for s in plan.steps if s.action in CHANGES)
    unchanged = sum(1 for s in plan.steps if s.action == "unchanged")
    kept = sum(s.detail.get("count", 0) for s in plan.steps if s.action == "keep")
    later = f"; {plural(kept, 'daemon')} over a count kept until idle" if kept else ""
    if dry_run:
        summary = f"dry run: {plural(changes, 'change')} planned, {unchanged} unchanged"
        return f"{summary}{later}; nothing sent"
    if not changes:
        return f"nothing to change ({unchanged} unchanged){later}"
    done = sum(1 for s in plan.steps if s.action in CHANGES and s.status == "done")
    return f"applied {done} of {plural(changes, 'change')} ({unchanged} unchanged){later}"


def _refuse(label: str, problems: list[Problem], as_json: bool) -> NoReturn:
    if as_json:
        rows = [{"line": p.line, "field": p.field, "message": p.message} for p in problems]
        output.data({"file": label, "errors": rows})
    for problem in problems:
        output.errors.print(
            Text.assemble(("error: ", "bold red"), problem.render(label)), soft_wrap=True
        )
    raise typer.Exit(1)


def run(ctx: typer.Context, file: str, *, dry_run: bool, as_json: bool) -> None:
    """``lakeshore apply`` (its options are declared in ``lakeshore.cli.apply_command``)."""
    cli = context.get(ctx)
    text, label = read_file(file)
    try:
        parsed = load(text, label)
        namespace = _namespace(ctx, cli, parsed)
    except FileInvalid as exc:
        _refuse(exc.label, exc.problems, as_json)
    plan = make_plan(parsed, gather(cli, namespace, parsed), namespace)
    on_step: Callable[[Step], None] = (lambda step: None) if as_json else _print_step
    if plan.problems:
        _refuse(label, plan.problems, as_json)
    ok = True
    if dry_run:
        for step in plan.steps:
            on_step(step)
    else:
        ok = execute(cli, namespace, plan, on_step)
    if as_json:
        changes = [step.to_json() for step in plan.steps]
        output.data(
            {"file": label, "namespace": namespace, "dryRun": dry_run, "ok": ok, "changes": changes}
        )
    else:
        output.note(_summary(plan, dry_run))
    if not ok:
        raise CliError("not everything was applied (see above); fix it and apply again")
