"""Planning ``lakeshore apply``: a pure comparison of the file with what the server has.

Missing providers and queues are created; a queue's fields that differ are PATCHed (only
those, each nested object whole, as PATCH replaces it); fields the file does not set are
left alone; nothing absent from the file is ever deleted. A compose entry launches or
retires daemons until ``daemons + in flight == count``. Anything that cannot be applied
becomes a problem naming the file's line.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Final

from lakeshore.cli import apply_schedules
from lakeshore.cli.apply_file import (
    ApplyFile,
    ComposeDecl,
    Problem,
    ProviderDecl,
    QueueDecl,
    policy_owned,
)

LAUNCH_BATCH: Final = 100  # the most daemons one POST …/daemons launches
CHANGES: Final = ("create", "replace", "update", "launch", "retire")


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
    # (queue, name) → the server's schedule, for the queues the file's schedules name
    schedules: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class Call:
    method: str
    segments: tuple[str, ...]
    body: Any = None


@dataclass
class Step:
    """One line of the plan, the requests that carry it out, and how that went."""

    action: str  # create | replace | update | unchanged | launch | retire | keep
    type: str  # provider | queue | schedule | daemons | daemon
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


def plural(count: int, word: str) -> str:
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
        f"+ {plural(missing, 'daemon')} for queue {entry.queue} "
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
            f"! {plural(kept, 'daemon')} over the count of {entry.count} for queue "
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
        text = f"= {plural(entry.count, 'daemon')} for queue {entry.queue} (unchanged)"
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
    for schedule in file.schedules:
        plan.add(apply_schedules.plan_schedule(file, schedule, state))
    for entry in file.daemons:
        plan.add(plan_compose(file, entry, state, namespace))
    return plan


# --- talking to the server -------------------------------------------------------------
