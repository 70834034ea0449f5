"""Reading ``lakeshore.yaml``: parse it keeping the line of every field, then validate it all.

The file is checked whole before ``lakeshore apply`` asks the server anything: queues by the
same rules the server applies (:func:`lakeshore.domain.queue.parse_spec`, so elasticity
kinds are underscored only), providers by their kind's config model
(:func:`lakeshore.providers.parse_config`), compose entries by :class:`ComposeEntry`. Every
problem is reported, each as ``FILE:LINE: FIELD: MESSAGE``, so one run lists them all.

PyYAML's composer gives nodes with marks; building the values ourselves (instead of
``safe_load``) keeps a line for every path, refuses duplicate keys (``safe_load`` silently
keeps the last one), and refuses values JSON cannot carry (dates, binary, NaN), which the
server would never see as written.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Final, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError

from lakeshore.cli.apply_schedules import ScheduleDecl, parse_decl
from lakeshore.domain.names import Name, is_valid_name
from lakeshore.domain.queue import QueueSpec, parse_spec
from lakeshore.domain.validation import describe, field_path
from lakeshore.errors import InvalidInput
from lakeshore.providers import parse_config

Path = tuple[str | int, ...]
T = TypeVar("T")

SECTIONS: Final = ("namespace", "providers", "queues", "daemons", "schedules")
MAX_COMPOSE_COUNT: Final = 10_000
MAX_DEPTH: Final = 64

_MAP_TAG: Final = "tag:yaml.org,2002:map"
_SEQ_TAG: Final = "tag:yaml.org,2002:seq"
_MERGE_TAG: Final = "tag:yaml.org,2002:merge"
_FIELD_PART_RE = re.compile(r"\[(\d+)\]|([^.\[\]]+)")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the file: where (line, field path) and what."""

    line: int
    field: str
    message: str

    def render(self, label: str) -> str:
        where = f"{self.field}: " if self.field else ""
        return f"{label}:{self.line}: {where}{self.message}"


class FileInvalid(Exception):
    """The file cannot be applied; :attr:`problems` says every reason found."""

    def __init__(self, label: str, problems: Sequence[Problem]) -> None:
        self.label = label
        self.problems = sorted(problems, key=lambda p: p.line)
        super().__init__("\n".join(self.messages()))

    def messages(self) -> list[str]:
        return [problem.render(self.label) for problem in self.problems]


class _Bad(Exception):
    """A structural problem found while building values from the YAML nodes."""

    def __init__(self, line: int, field: str, message: str) -> None:
        super().__init__(message)
        self.problem = Problem(line, field, message)


def show_path(path: Path) -> str:
    """``("queues", 1, "elasticity")`` → ``queues[1].elasticity``."""
    return field_path(path)


def parse_field(text: str) -> Path:
    """``"elasticity.match.tags[0]"`` → ``("elasticity", "match", "tags", 0)``."""
    parts: list[str | int] = []
    for index, key in _FIELD_PART_RE.findall(text):
        parts.append(int(index) if index else key)
    return tuple(parts)


@dataclass
class Located:
    """A YAML document as plain values, with the line each path starts on."""

    value: Any
    lines: dict[Path, int] = field(default_factory=dict)

    def line_of(self, path: Path) -> int:
        """The line of ``path``, or of its deepest ancestor present in the file."""
        for end in range(len(path), -1, -1):
            line = self.lines.get(path[:end])
            if line is not None:
                return line
        return 1

    def problem(self, path: Path, message: str) -> Problem:
        return Problem(self.line_of(path), show_path(path), message)


class _Builder:
    """Turns composed nodes into JSON values, recording lines on the way."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self.lines: dict[Path, int] = {}

    def build(self, node: Any, path: Path, line: int) -> Any:
        self.lines.setdefault(path, line)
        if len(path) > MAX_DEPTH:
            raise _Bad(line, show_path(path), "nested too deep (a recursive alias?)")
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path)
        if isinstance(node, yaml.SequenceNode):
            if node.tag != _SEQ_TAG:
                raise _Bad(line, show_path(path), f"unsupported YAML tag {node.tag}")
            return [
                self.build(item, (*path, i), item.start_mark.line + 1)
                for i, item in enumerate(node.value)
            ]
        return self._scalar(node, path, line)

    def _scalar(self, node: Any, path: Path, line: int) -> Any:
        value = self.loader.construct_object(node, deep=True)
        if isinstance(value, float) and not math.isfinite(value):
            raise _Bad(line, show_path(path), "NaN and infinite numbers are not valid JSON")
        if value is None or isinstance(value, bool | int | float | str):
            return value
        raise _Bad(
            line,
            show_path(path),
            f"a YAML {type(value).__name__} value is not JSON; quote it to make it text",
        )

    def _key(self, node: Any, path: Path) -> str:
        line = node.start_mark.line + 1
        if not isinstance(node, yaml.ScalarNode):
            raise _Bad(line, show_path(path), "a key must be text, not a list or mapping")
        key = self.loader.construct_object(node)
        if not isinstance(key, str):
            raise _Bad(line, show_path(path), f"key {key!r} must be text; quote it")
        return key

    def _mapping(self, node: Any, path: Path) -> dict[str, Any]:
        if node.tag != _MAP_TAG:
            raise _Bad(
                node.start_mark.line + 1, show_path(path), f"unsupported YAML tag {node.tag}"
            )
        merged: dict[str, Any] = {}
        own: dict[str, Any] = {}
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if key_node.tag == _MERGE_TAG:
                merged.update(self._merge(value_node, path, line))
                continue
            key = self._key(key_node, path)
            if key in seen:
                raise _Bad(
                    line,
                    show_path((*path, key)),
                    f"duplicate key {key!r} (lines {seen[key]} and {line})",
                )
            seen[key] = line
            self.lines[(*path, key)] = line  # the key's line, not its nested value's
            own[key] = self.build(value_node, (*path, key), line)
        return {**merged, **own}

    def _merge(self, node: Any, path: Path, line: int) -> dict[str, Any]:
        """A ``<<: *anchor`` merge key (one mapping or a list of them; earlier ones win)."""
        sources = node.value if isinstance(node, yaml.SequenceNode) else [node]
        merged: dict[str, Any] = {}
        for source in reversed(sources):
            if not isinstance(source, yaml.MappingNode):
                raise _Bad(line, show_path(path), "a merge key (<<) takes mappings only")
            merged.update(self._mapping(source, path))
        return merged


def locate(text: str) -> Located:
    """Parse one YAML document, keeping lines; :class:`_Bad` on anything not JSON-like."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise _Bad(1, "", f"the file is empty; expected the keys {', '.join(SECTIONS)}")
        builder = _Builder(loader)
        value = builder.build(node, (), node.start_mark.line + 1)
        return Located(value, builder.lines)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        what = exc.problem or "cannot parse"
        if exc.context:
            what += f" ({exc.context})"
        raise _Bad(line, "", f"not valid YAML: {what}") from None
    except yaml.YAMLError as exc:
        raise _Bad(1, "", f"not valid YAML: {exc}") from None
    finally:
        loader.dispose()


# --- the declarations ---------------------------------------------------------------


class ProviderEntry(BaseModel):
    """One ``providers:`` item (its config is then checked against its kind)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    name: Name
    kind: StrictStr
    config: dict[str, Any] | None = None


class ComposeEntry(BaseModel):
    """One ``daemons:`` item: keep exactly ``count`` daemons serving a fixed queue."""

    model_config = ConfigDict(strict=True, extra="forbid")

    queue: Name
    provider: Name | None = None
    count: Annotated[int, Field(ge=0, le=MAX_COMPOSE_COUNT)]


@dataclass(frozen=True)
class ProviderDecl:
    name: str
    kind: str
    config: dict[str, Any]  # as the server stores it: validated, defaults filled in
    index: int
    line: int


@dataclass(frozen=True)
class QueueDecl:
    name: str
    spec: QueueSpec
    given: dict[str, Any]  # the top-level fields the file sets, normalized; None clears
    index: int
    line: int

    @property
    def elasticity_kind(self) -> str | None:
        """The kind the file sets (``fixed`` when it clears elasticity); None: not set."""
        if "elasticity" not in self.given:
            return None
        return self.spec.elasticity.kind if self.spec.elasticity else "fixed"


@dataclass(frozen=True)
class ComposeDecl:
    queue: str
    provider: str | None
    count: int
    index: int
    line: int


@dataclass(frozen=True)
class ApplyFile:
    """A validated ``lakeshore.yaml``."""

    label: str
    namespace: str | None
    providers: tuple[ProviderDecl, ...]
    queues: tuple[QueueDecl, ...]
    daemons: tuple[ComposeDecl, ...]
    located: Located
    schedules: tuple[ScheduleDecl, ...] = ()  # see lakeshore.cli.apply_schedules

    def problem(self, path: Path, message: str) -> Problem:
        """A problem about ``path`` found later (against the server), with its line."""
        return self.located.problem(path, message)

    def queue(self, name: str) -> QueueDecl | None:
        return next((q for q in self.queues if q.name == name), None)

    def provider(self, name: str) -> ProviderDecl | None:
        return next((p for p in self.providers if p.name == name), None)


def _pydantic_problems(doc: Located, path: Path, exc: ValidationError) -> list[Problem]:
    problems = []
    for error in exc.errors():
        full = (*path, *error.get("loc", ()))
        _, message = describe({**error, "loc": ()})
        problems.append(doc.problem(full, message))
    return problems


def _invalid_input_problem(doc: Located, path: Path, exc: InvalidInput) -> Problem:
    message = exc.message
    if exc.field:
        message = message.removeprefix(f"{exc.field}: ")
        path = (*path, *parse_field(exc.field))
    return doc.problem(path, message)


def _items(doc: Located, section: str, problems: list[Problem]) -> list[tuple[int, Any]]:
    value = doc.value.get(section)
    if value is None:
        return []
    if not isinstance(value, list):
        problems.append(doc.problem((section,), f"{section} is a list (items start with '- ')"))
        return []
    return list(enumerate(value))


def _provider(doc: Located, index: int, raw: Any) -> ProviderDecl:
    path: Path = ("providers", index)
    try:
        entry = ProviderEntry.model_validate(raw)
        config = parse_config(entry.kind, entry.config or {})
    except ValidationError as exc:
        raise _Many(_pydantic_problems(doc, path, exc)) from None
    except InvalidInput as exc:
        raise _Many([_invalid_input_problem(doc, path, exc)]) from None
    normalized = config.model_dump(mode="json", exclude_none=True)
    return ProviderDecl(entry.name, entry.kind, normalized, index, doc.line_of(path))


def _queue(doc: Located, index: int, raw: Any) -> QueueDecl:
    path: Path = ("queues", index)
    try:
        spec = parse_spec(raw)
    except InvalidInput as exc:
        raise _Many([_invalid_input_problem(doc, path, exc)]) from None
    written = spec.to_json()
    given = {key: written.get(key) for key in raw}
    return QueueDecl(spec.name, spec, given, index, doc.line_of(path))


def _compose(doc: Located, index: int, raw: Any) -> ComposeDecl:
    path: Path = ("daemons", index)
    try:
        entry = ComposeEntry.model_validate(raw)
    except ValidationError as exc:
        raise _Many(_pydantic_problems(doc, path, exc)) from None
    return ComposeDecl(entry.queue, entry.provider, entry.count, index, doc.line_of(path))


class _Many(Exception):
    def __init__(self, problems: list[Problem]) -> None:
        super().__init__(problems)
        self.problems = problems


def _section(
    doc: Located,
    section: str,
    parse: Callable[[Located, int, Any], T],
    problems: list[Problem],
) -> list[T]:
    found = []
    for index, raw in _items(doc, section, problems):
        if not isinstance(raw, dict):
            problems.append(doc.problem((section, index), "each item is a mapping of fields"))
            continue
        try:
            found.append(parse(doc, index, raw))
        except _Many as exc:
            problems.extend(exc.problems)
    return found


def _duplicates(
    doc: Located, decls: Sequence[Any], section: str, key: str, what: str
) -> list[Problem]:
    first: dict[str, Any] = {}
    problems = []
    for decl in decls:
        name = getattr(decl, key)
        earlier = first.setdefault(name, decl)
        if earlier is not decl:
            where = (section, decl.index, key)
            message = f'{what} "{name}" is declared twice (lines {earlier.line} and {decl.line})'
            problems.append(doc.problem(where, message))
    return problems


def _compose_on_policy_queues(
    doc: Located, queues: Sequence[QueueDecl], daemons: Sequence[ComposeDecl]
) -> list[Problem]:
    declared = {q.name: q for q in queues}
    problems = []
    for entry in daemons:
        queue = declared.get(entry.queue)
        kind = queue.elasticity_kind if queue else None
        if queue is None or kind is None or kind == "fixed":
            continue
        message = policy_owned(entry.queue, kind, f"line {queue.line}")
        problems.append(doc.problem(("daemons", entry.index, "queue"), message))
    return problems


def policy_owned(queue: str, kind: str, where: str) -> str:
    """Why a compose entry is refused for a queue an elasticity policy scales."""
    return (
        f'queue "{queue}" is {kind} ({where}): the controller owns its fleet; compose counts '
        "are for fixed queues only (drop this entry, or set elasticity.kind: fixed)"
    )


def _top(doc: Located) -> tuple[str | None, list[Problem]]:
    if not isinstance(doc.value, dict):
        expected = ", ".join(SECTIONS)
        return None, [doc.problem((), f"the file is a mapping with the keys {expected}")]
    problems = [
        doc.problem((key,), f"unknown key; expected one of {', '.join(SECTIONS)}")
        for key in doc.value
        if key not in SECTIONS
    ]
    namespace = doc.value.get("namespace")
    if namespace is not None and not (isinstance(namespace, str) and is_valid_name(namespace)):
        problems.append(doc.problem(("namespace",), f"{namespace!r} is not a namespace name"))
        namespace = None
    return namespace, problems


def load(text: str, label: str) -> ApplyFile:
    """Parse and validate a whole ``lakeshore.yaml``; :class:`FileInvalid` lists every
    problem found, each with its line and field."""
    try:
        doc = locate(text)
    except _Bad as exc:
        raise FileInvalid(label, [exc.problem]) from None
    namespace, problems = _top(doc)
    if not isinstance(doc.value, dict):
        raise FileInvalid(label, problems)
    providers = _section(doc, "providers", _provider, problems)
    queues = _section(doc, "queues", _queue, problems)
    daemons = _section(doc, "daemons", _compose, problems)
    schedules = _section(doc, "schedules", parse_decl, problems)
    problems += _duplicates(doc, providers, "providers", "name", "provider")
    problems += _duplicates(doc, queues, "queues", "name", "queue")
    problems += _duplicates(doc, daemons, "daemons", "queue", "compose entry for queue")
    problems += _compose_on_policy_queues(doc, queues, daemons)
    problems += _duplicates(doc, schedules, "schedules", "name", "schedule")
    if problems:
        raise FileInvalid(label, problems)
    return ApplyFile(
        label, namespace, tuple(providers), tuple(queues), tuple(daemons), doc, tuple(schedules)
    )
