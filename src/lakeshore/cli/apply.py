"""``lakeshore apply -f lakeshore.yaml``: make a namespace match a file, and say what changed.

Three steps, kept apart so the middle one is a pure function of values:

1. **gather** what the server has: providers, queues (archived ones too), and for each
   compose entry the queue's daemons (retiring ones left out) and launches in flight;
2. **plan**: compare. Missing providers and queues are created; a queue's fields that differ
   are PATCHed (only those, each nested object whole, as PATCH replaces it); fields the file
   does not set are left alone; nothing absent from the file is ever deleted. A compose
   entry launches or retires daemons until ``daemons + in flight == count``. Anything that
   cannot be applied becomes a problem naming the file's line, and nothing is sent;
3. **execute** the plan's calls in order: providers, queues, then compose.

Providers have no PATCH. A provider whose kind or config differs is *replaced* (DELETE, then
POST) when no queue on the server names it; when one does, the plan refuses with a message
saying which queues, since deleting it would be refused by the server anyway and the queues
would launch through nothing in between.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Final, NoReturn

import typer
from rich.text import Text

from lakeshore.cli import context, output
from lakeshore.cli.apply_file import (
    ApplyFile,
    ComposeDecl,
    FileInvalid,
    Problem,
    ProviderDecl,
    QueueDecl,
    load,
    policy_owned,
)
from lakeshore.cli.client import CliError
from lakeshore.cli.context import CliContext

LAUNCH_BATCH: Final = 100  # the most daemons one POST …/daemons launches
_STYLES: Final = {"+": "green", "~": "yellow", "-": "red", "!": "bold yellow", "=": "dim"}
_CHANGES: Final = ("create", "replace", "update", "launch", "retire")


class _Unset:
    def __repr__(self) -> str:
        return "(unset)"


UNSET: Final = _Unset()


@dataclass(frozen=True)
class Fleet:
    """A queue's daemons (not retiring) and its launches still in flight."""

    daemons: tuple[dict[str, Any], ...]
    in_flight: int

    @property
    def size(self) -> int:
        return len(self.daemons) + self.in_flight


@dataclass(frozen=True)
class ServerState:
    providers: dict[str, dict[str, Any]]
    queues: dict[str, dict[str, Any]]
    fleets: dict[str, Fleet]


@dataclass(frozen=True)
class Call:
    method: str
    segments: tuple[str, ...]
    body: Any = None


@dataclass
class Step:
    """One line of the plan, the requests that carry it out, and how that went."""

    action: str  # create | replace | update | unchanged | launch | retire | keep
    type: str  # provider | queue | daemons | daemon
    name: str
    text: str
    calls: list[Call] = field(default_factory=list)
    detail: dict[str, Any] = field(default_factory=dict)
    status: str = "planned"
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        data = {"action": self.action, "type": self.type, "name": self.name, **self.detail}
        data["status"] = self.status
        if self.error is not None:
            data["error"] = self.error
        return data


@dataclass
class Plan:
    steps: list[Step] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    def add(self, found: Step | Problem | list[Step]) -> None:
        if isinstance(found, Problem):
            self.problems.append(found)
        elif isinstance(found, Step):
            self.steps.append(found)
        else:
            self.steps.extend(found)


# --- comparing -------------------------------------------------------------------------


def _norm(value: Any) -> Any:
    return UNSET if value is None else value


def _same(old: Any, new: Any) -> bool:
    return isinstance(old, bool) == isinstance(new, bool) and bool(old == new)


def field_changes(old: Any, new: Any, path: str) -> list[tuple[str, Any, Any]]:
    """Leaf-level differences between two JSON values, as ``(path, old, new)``;
    a missing or null value is :data:`UNSET`."""
    old, new = _norm(old), _norm(new)
    if isinstance(old, dict | _Unset) and isinstance(new, dict | _Unset) and old is not new:
        before = old if isinstance(old, dict) else {}
        after = new if isinstance(new, dict) else {}
        changes = []
        for key in [*after, *(k for k in before if k not in after)]:
            child = f"{path}.{key}" if path else str(key)
            changes += field_changes(before.get(key), after.get(key), child)
        return changes
    return [] if _same(old, new) else [(path, old, new)]


def show(value: Any) -> str:
    if isinstance(value, _Unset):
        return "(unset)"
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= 60 else text[:59] + "…"


def _fields_text(changes: list[tuple[str, Any, Any]]) -> str:
    return ", ".join(f"{path} {show(old)} → {show(new)}" for path, old, new in changes)


def _fields_json(changes: list[tuple[str, Any, Any]]) -> list[dict[str, Any]]:
    def plain(value: Any) -> Any:
        return None if isinstance(value, _Unset) else value

    return [{"field": p, "from": plain(old), "to": plain(new)} for p, old, new in changes]


# --- planning (pure) -------------------------------------------------------------------


def _users(queues: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    """Provider name → the server's queues naming it (providerRef or daemonTemplate)."""
    users: dict[str, list[str]] = defaultdict(list)
    for queue in queues.values():
        template = queue.get("daemonTemplate") or {}
        for name in {queue.get("providerRef"), template.get("provider")} - {None}:
            users[str(name)].append(queue["name"])
    return users


def plan_provider(
    file: ApplyFile, decl: ProviderDecl, state: ServerState, users: dict[str, list[str]]
) -> Step | Problem:
    body = {"name": decl.name, "kind": decl.kind, "config": decl.config}
    label = f"provider {decl.name} ({decl.kind})"
    current = state.providers.get(decl.name)
    if current is None:
        create = Call("POST", ("providers",), body)
        return Step("create", "provider", decl.name, f"+ {label}", [create], {"kind": decl.kind})
    before = {"kind": current.get("kind"), "config": current.get("config") or {}}
    changes = field_changes(before, {"kind": decl.kind, "config": decl.config}, "")
    if not changes:
        return Step("unchanged", "provider", decl.name, f"= provider {decl.name} (unchanged)")
    naming = sorted(users.get(decl.name, []))
    if naming:
        listed = ", ".join(f'"{name}"' for name in naming)
        return file.problem(
            ("providers", decl.index, changes[0][0].split(".")[0]),
            f'provider "{decl.name}" differs from the server\'s ({_fields_text(changes)}) and '
            f"providers cannot be changed in place; queue{'s' if len(naming) > 1 else ''} "
            f"{listed} name{'' if len(naming) > 1 else 's'} it, so it is not replaced: point "
            "them at another provider first, or make the file match the server",
        )
    calls = [Call("DELETE", ("providers", decl.name)), Call("POST", ("providers",), body)]
    text = f"~ {label}: {_fields_text(changes)} (replaced: no queue names it)"
    detail = {"kind": decl.kind, "fields": _fields_json(changes)}
    return Step("replace", "provider", decl.name, text, calls, detail)


def plan_queue(file: ApplyFile, decl: QueueDecl, state: ServerState) -> Step | Problem:
    current = state.queues.get(decl.name)
    if current is None:
        body = decl.spec.to_json()
        policy = decl.spec.elasticity.kind if decl.spec.elasticity else "fixed"
        text = f"+ queue {decl.name} ({decl.spec.kind}, {policy})"
        return Step("create", "queue", decl.name, text, [Call("POST", ("queues",), body)])
    changes: list[tuple[str, Any, Any]] = []
    patch: dict[str, Any] = {}
    for key, value in decl.given.items():
        differ = field_changes(current.get(key), value, key)
        if differ:
            patch[key] = value
            changes += differ
    if not patch:
        return Step("unchanged", "queue", decl.name, f"= queue {decl.name} (unchanged)")
    if current.get("state") == "archived":
        return file.problem(
            ("queues", decl.index),
            f'queue "{decl.name}" is archived (read-only) and differs from the file '
            f"({_fields_text(changes)}); unarchive it first",
        )
    call = Call("PATCH", ("queues", decl.name), patch)
    text = f"~ queue {decl.name}: {_fields_text(changes)}"
    return Step("update", "queue", decl.name, text, [call], {"fields": _fields_json(changes)})


def _desired_queue(file: ApplyFile, state: ServerState, name: str) -> dict[str, Any] | None:
    """The queue as it will be once the file is applied (None: neither has it)."""
    current = state.queues.get(name)
    declared = file.queue(name)
    if declared is None:
        return current
    merged = dict(current or {}) if current is not None else declared.spec.to_json()
    merged.update(declared.given)
    return {key: value for key, value in merged.items() if value is not None}


def _check_compose_queue(
    file: ApplyFile, entry: ComposeDecl, state: ServerState, namespace: str
) -> Problem | None:
    path = ("daemons", entry.index, "queue")
    queue = _desired_queue(file, state, entry.queue)
    if queue is None:
        return file.problem(
            path,
            f'queue "{entry.queue}" is neither declared in this file nor on the server '
            f'(namespace "{namespace}")',
        )
    kind = (queue.get("elasticity") or {}).get("kind", "fixed")
    if kind != "fixed":  # a queue declared with its elasticity was checked with the file
        return file.problem(path, policy_owned(entry.queue, kind, "on the server"))
    return None


def _launch_provider(
    file: ApplyFile, entry: ComposeDecl, state: ServerState
) -> tuple[str | None, Problem | None]:
    queue = _desired_queue(file, state, entry.queue) or {}
    named = (
        entry.provider
        or queue.get("providerRef")
        or (queue.get("daemonTemplate") or {}).get("provider")
    )
    if named is None:
        return None, file.problem(
            ("daemons", entry.index),
            f'queue "{entry.queue}" has no providerRef / daemonTemplate.provider: name the '
            "provider to launch through in this entry (provider: …)",
        )
    if named not in state.providers and file.provider(named) is None:
        return None, file.problem(
            ("daemons", entry.index, "provider"),
            f'provider "{named}" is neither declared in this file nor on the server',
        )
    return named, None


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _launch_step(entry: ComposeDecl, have: int, provider: str) -> Step:
    missing = entry.count - have
    calls = []
    for start in range(0, missing, LAUNCH_BATCH):
        body: dict[str, Any] = {"queue": entry.queue, "count": min(LAUNCH_BATCH, missing - start)}
        if entry.provider:
            body["provider"] = entry.provider
        calls.append(Call("POST", ("daemons",), body))
    text = (
        f"+ {_plural(missing, 'daemon')} for queue {entry.queue} "
        f"({have} → {entry.count}, through {provider})"
    )
    detail = {"queue": entry.queue, "count": missing, "from": have, "to": entry.count}
    return Step("launch", "daemons", entry.queue, text, calls, {**detail, "provider": provider})


def _victims(fleet: Fleet, extras: int) -> list[dict[str, Any]]:
    """Idle daemons to retire: those serving only this queue first, newest first."""
    idle = [d for d in fleet.daemons if not d.get("running")]
    idle.sort(key=lambda d: str(d.get("createdAt") or ""), reverse=True)
    idle.sort(key=lambda d: len(d.get("queues") or ()))
    return idle[:extras]


def _retire_steps(entry: ComposeDecl, fleet: Fleet) -> list[Step]:
    extras = fleet.size - entry.count
    steps = [
        Step(
            "retire",
            "daemon",
            str(daemon["id"]),
            f"- daemon {daemon['id']} (queue {entry.queue})",
            [Call("DELETE", ("daemons", str(daemon["id"])))],
            {"queue": entry.queue},
        )
        for daemon in _victims(fleet, extras)
    ]
    kept = extras - len(steps)
    if kept:
        busy = sum(1 for d in fleet.daemons if d.get("running"))
        parts = [f"{busy} running invocations"] if busy else []
        parts += [f"{fleet.in_flight} still launching"] if fleet.in_flight else []
        reason = ", ".join(parts)
        text = (
            f"! {_plural(kept, 'daemon')} over the count of {entry.count} for queue "
            f"{entry.queue} kept ({reason}); only idle daemons are retired: apply again later"
        )
        detail = {"queue": entry.queue, "count": kept, "reason": reason}
        steps.append(Step("keep", "daemons", entry.queue, text, [], detail))
    return steps


def plan_compose(
    file: ApplyFile, entry: ComposeDecl, state: ServerState, namespace: str
) -> list[Step] | Problem:
    problem = _check_compose_queue(file, entry, state, namespace)
    if problem is not None:
        return problem
    fleet = state.fleets.get(entry.queue, Fleet((), 0))
    if fleet.size == entry.count:
        text = f"= {_plural(entry.count, 'daemon')} for queue {entry.queue} (unchanged)"
        return [Step("unchanged", "daemons", entry.queue, text, [], {"count": entry.count})]
    if fleet.size > entry.count:
        return _retire_steps(entry, fleet)
    provider, problem = _launch_provider(file, entry, state)
    if problem is not None or provider is None:
        return problem or []
    return [_launch_step(entry, fleet.size, provider)]


def make_plan(file: ApplyFile, state: ServerState, namespace: str) -> Plan:
    """What applying ``file`` to a namespace holding ``state`` would do, or why it cannot."""
    plan = Plan()
    users = _users(state.queues)
    for provider in file.providers:
        plan.add(plan_provider(file, provider, state, users))
    for queue in file.queues:
        plan.add(plan_queue(file, queue, state))
    for entry in file.daemons:
        plan.add(plan_compose(file, entry, state, namespace))
    return plan


# --- talking to the server -------------------------------------------------------------


def gather(cli: CliContext, namespace: str, file: ApplyFile) -> ServerState:
    """What the namespace holds now, as far as the file is concerned."""

    def get(*segments: str, params: dict[str, Any] | None = None) -> Any:
        return cli.client.request("GET", cli.ns_path(*segments, namespace=namespace), params=params)

    providers = {p["name"]: p for p in get("providers")["providers"]}
    listed = get("queues", params={"include_archived": "true"})["queues"]
    queues = {q["name"]: q for q in listed}
    fleets = {}
    for entry in file.daemons:
        if entry.queue in queues:
            daemons = get("daemons", params={"queue": entry.queue})["daemons"]
            stats = get("queues", entry.queue, "stats")
            serving = tuple(d for d in daemons if not d.get("retiring"))
            fleets[entry.queue] = Fleet(serving, int(stats.get("inFlight") or 0))
    return ServerState(providers, queues, fleets)


def _busy(exc: CliError) -> bool:
    """A refused retire because the daemon took work since the plan (409)."""
    return "[409 " in str(exc)


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


def _read(path: str) -> tuple[str, str]:
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
    changes = sum(1 for s in plan.steps if s.action in _CHANGES)
    unchanged = sum(1 for s in plan.steps if s.action == "unchanged")
    kept = sum(s.detail.get("count", 0) for s in plan.steps if s.action == "keep")
    later = f"; {_plural(kept, 'daemon')} over a count kept until idle" if kept else ""
    if dry_run:
        summary = f"dry run: {_plural(changes, 'change')} planned, {unchanged} unchanged"
        return f"{summary}{later}; nothing sent"
    if not changes:
        return f"nothing to change ({unchanged} unchanged){later}"
    done = sum(1 for s in plan.steps if s.action in _CHANGES and s.status == "done")
    return f"applied {done} of {_plural(changes, 'change')} ({unchanged} unchanged){later}"


def _refuse(label: str, problems: list[Problem], as_json: bool) -> NoReturn:
    if as_json:
        rows = [{"line": p.line, "field": p.field, "message": p.message} for p in problems]
        output.print_json({"file": label, "errors": rows})
    for problem in problems:
        output.errors.print(
            Text.assemble(("error: ", "bold red"), problem.render(label)), soft_wrap=True
        )
    raise typer.Exit(1)


def apply(
    ctx: typer.Context,
    file: Annotated[
        str,
        typer.Option(
            "--file",
            "-f",
            help="The file to apply (lakeshore.yaml; - reads standard input).",
            show_default=False,
        ),
    ],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the changes and make none.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the plan and its results as JSON.")
    ] = False,
) -> None:
    """Create or change providers, queues and compose counts to match a file.

    Idempotent: a second run reports everything unchanged. Nothing absent from the file is
    deleted, and fields a queue in the file does not set are left alone. See docs/apply.md.
    """
    cli = context.get(ctx)
    text, label = _read(file)
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
        output.print_json(
            {"file": label, "namespace": namespace, "dryRun": dry_run, "ok": ok, "changes": changes}
        )
    else:
        output.note(_summary(plan, dry_run))
    if not ok:
        raise CliError("not everything was applied (see above); fix it and apply again")
