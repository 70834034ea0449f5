"""``lakeshore queues``: create, inspect, change and move queues through their lifecycle."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from lakeshore.cli import context, output, verbs
from lakeshore.cli.client import CliError
from lakeshore.domain.kinds import ELASTICITY_KINDS, QUEUE_KINDS, normalize_elasticity_kind

app = typer.Typer(help="Create, inspect and change queues.", no_args_is_help=True)

Name = Annotated[str, typer.Argument(help="Queue name.", show_default=False)]
Json = Annotated[bool, typer.Option("--json", help=output.JSON_HELP)]
Kind = Annotated[
    str | None, typer.Option("--kind", help=f"Dispatch discipline: {', '.join(QUEUE_KINDS)}.")
]
ElasticityOpt = Annotated[
    str | None,
    typer.Option(
        "--elasticity",
        help="Scaling policy: fixed, fully-elastic, pool-with-threshold, max-count, "
        "wait-target (underscored spellings work too).",
    ),
]
Provider = Annotated[str | None, typer.Option("--provider", help="Provider to launch through.")]
Min = Annotated[int | None, typer.Option("--min", help="Fewest daemons to keep.", min=0)]
Max = Annotated[int | None, typer.Option("--max", help="Most daemons to run.", min=0)]
Threshold = Annotated[
    float | None,
    typer.Option("--threshold", help="pool_with_threshold: utilization that scales up (0-1]."),
]
ThresholdLow = Annotated[
    float | None,
    typer.Option("--threshold-low", help="pool_with_threshold: utilization that scales down."),
]
Pool = Annotated[str | None, typer.Option("--pool", help="Shared pool to tick this queue in.")]
Wait = Annotated[
    str | None,
    typer.Option(
        "--wait",
        help="wait_target: the p95 submit → start wait to keep under (60, 60s, 5m, 1h).",
        show_default=False,
    ),
]
MaxStep = Annotated[
    int | None,
    typer.Option(
        "--max-step",
        min=1,
        help="Most daemons launched (or killed) in one tick (default 1; wait_target: no "
        "limit below --max).",
        show_default=False,
    ),
]
Description = Annotated[str | None, typer.Option("--description", help="What the queue is for.")]
Retention = Annotated[
    float | None,
    typer.Option(
        "--retention-s",
        help="Seconds a finished invocation (and its stream) is kept, and its key remembered; "
        "unset: the server's LAKESHORE_RETENTION_S (7 days).",
    ),
]


def elasticity_kind(value: str) -> str:
    """The CLI takes hyphenated or underscored kinds and sends the underscored one."""
    kind = normalize_elasticity_kind(value)
    if kind not in ELASTICITY_KINDS:
        choices = ", ".join(k.replace("_", "-") for k in ELASTICITY_KINDS)
        raise typer.BadParameter(
            f"unknown elasticity {value!r}; choose {choices}", param_hint="--elasticity"
        )
    return kind


def _scaling(
    current: dict[str, Any] | None,
    kind: str | None,
    knobs: dict[str, Any],
) -> dict[str, Any] | None:
    given = {key: value for key, value in knobs.items() if value is not None}
    if kind is None and not given:
        return None
    if kind is None and current is None:
        flags = ", ".join(f"--{key.replace('_', '-')}" for key in given)
        verb = "needs" if len(given) == 1 else "need"
        raise typer.BadParameter(f"{flags} {verb} --elasticity (the queue has no scaling policy)")
    elasticity = dict(current or {})
    if kind is not None:
        elasticity["kind"] = elasticity_kind(kind)
    elasticity.update(given)
    return elasticity


def _plain_fields(
    kind: str | None, provider: str | None, description: str | None, retention_s: float | None
) -> dict[str, Any]:
    given = {
        "kind": kind,
        "providerRef": provider,
        "description": description,
        "retention_s": retention_s,
    }
    return {field: value for field, value in given.items() if value is not None}


def _knobs(
    min_: int | None,
    max_: int | None,
    threshold: float | None,
    threshold_low: float | None,
    pool: str | None,
    wait: str | None = None,
    max_step: int | None = None,
) -> dict[str, Any]:
    return {
        "min": min_,
        "max": max_,
        "threshold": threshold,
        "threshold_low": threshold_low,
        "pool": pool,
        "wait_s": _seconds(wait) if wait is not None else None,
        "max_step": max_step,
    }


def _seconds(text: str) -> float:
    """``--wait``: seconds, with an optional s, m or h."""
    from lakeshore.elasticity.workload import WorkloadError, seconds

    try:
        value = seconds(text)
    except WorkloadError as exc:
        raise typer.BadParameter(str(exc), param_hint="--wait") from None
    if value <= 0:
        raise typer.BadParameter(f"{text!r}: must be more than 0 seconds", param_hint="--wait")
    return value


def _render(queue: dict[str, Any], as_json: bool) -> None:
    if as_json:
        output.data(queue)
    else:
        output.fields(queue, title=f"queue {queue['name']}")


@verbs.command(app, "create", "add")
def create(
    ctx: typer.Context,
    name: Name,
    kind: Kind = None,
    elasticity: ElasticityOpt = None,
    provider: Provider = None,
    min_: Min = None,
    max_: Max = None,
    threshold: Threshold = None,
    threshold_low: ThresholdLow = None,
    pool: Pool = None,
    wait: Wait = None,
    max_step: MaxStep = None,
    description: Description = None,
    retention_s: Retention = None,
    as_json: Json = False,
) -> None:
    """Create a queue (submitting to a missing queue also creates one, as fifo)."""
    cli = context.get(ctx)
    body = {"name": name, **_plain_fields(kind, provider, description, retention_s)}
    knobs = _knobs(min_, max_, threshold, threshold_low, pool, wait, max_step)
    scaling = _scaling(None, elasticity, knobs)
    if scaling is not None:
        body["elasticity"] = scaling
    _render(cli.client.request("POST", cli.ns_path("queues"), json=body), as_json)


@app.command("patch")
def patch(
    ctx: typer.Context,
    name: Name,
    kind: Kind = None,
    elasticity: ElasticityOpt = None,
    provider: Provider = None,
    min_: Min = None,
    max_: Max = None,
    threshold: Threshold = None,
    threshold_low: ThresholdLow = None,
    pool: Pool = None,
    wait: Wait = None,
    max_step: MaxStep = None,
    description: Description = None,
    retention_s: Retention = None,
    as_json: Json = False,
) -> None:
    """Change a live queue; the controller uses the new values on its next tick.

    Scaling flags change only the knobs given: the rest of the queue's elasticity is kept.
    """
    cli = context.get(ctx)
    body = _plain_fields(kind, provider, description, retention_s)
    knobs = _knobs(min_, max_, threshold, threshold_low, pool, wait, max_step)
    if elasticity is not None or any(v is not None for v in knobs.values()):
        current = cli.client.request("GET", cli.ns_path("queues", name)).get("elasticity")
        body["elasticity"] = _scaling(current, elasticity, knobs)
    if not body:
        raise CliError("nothing to change: give at least one option (see --help)")
    _render(cli.client.request("PATCH", cli.ns_path("queues", name), json=body), as_json)


@app.command("list")
def list_(
    ctx: typer.Context,
    include_archived: Annotated[
        bool, typer.Option("--all", help="Include archived queues.")
    ] = False,
    as_json: Json = False,
) -> None:
    """List the namespace's queues by name: all of them (the server's pages in turn)."""
    cli = context.get(ctx)
    params = {"include_archived": "true"} if include_archived else None
    queues = cli.client.every_page(cli.ns_path("queues"), "queues", params=params)
    if as_json:
        output.data(queues)
        return
    rows = [
        [
            q["name"],
            q["kind"],
            q["state"],
            (q.get("elasticity") or {}).get("kind", "fixed"),
            q.get("providerRef"),
            (q.get("elasticity") or {}).get("pool"),
            (q.get("elasticity") or {}).get("min"),
            (q.get("elasticity") or {}).get("max"),
            q.get("description"),
            q["createdAt"],
        ]
        for q in queues
    ]
    columns = ["name", "kind", "state", "elasticity", "provider", "pool"]
    output.table([*columns, "min", "max", "description", "created"], rows, wide=4)


@app.command("show")
def show(ctx: typer.Context, name: Name, as_json: Json = False) -> None:
    """Show one queue's record."""
    cli = context.get(ctx)
    _render(cli.client.request("GET", cli.ns_path("queues", name)), as_json)


@app.command("stats")
def stats(ctx: typer.Context, name: Name, as_json: Json = False) -> None:
    """Show a queue's signals: pending, running, daemons, utilization, launches in flight."""
    cli = context.get(ctx)
    data = cli.client.request("GET", cli.ns_path("queues", name, "stats"))
    if as_json:
        output.data(data)
    else:
        output.fields(data, title=f"stats for {name}")


def _transition(action: str, doc: str) -> None:
    def command(ctx: typer.Context, name: Name, as_json: Json = False) -> None:
        cli = context.get(ctx)
        queue = cli.client.request("POST", cli.ns_path("queues", name, action))
        if as_json:
            output.data(queue)
        else:
            output.console.print(f"queue [bold]{name}[/bold] is now {queue['state']}")

    command.__doc__ = doc
    app.command(action)(command)


_transition("drain", "Stop accepting submits; pending work still runs; the controller skips it.")
_transition("pause", "Keep accepting submits but dispatch nothing; the controller skips it.")
_transition("resume", "Return a draining or paused queue to active.")
_transition("archive", "Make a drained queue read-only and hide it from lists.")
_transition("unarchive", "Return an archived (or draining, or paused) queue to active.")
