"""``lakeshore queues events|explain``, ``lakeshore pools events`` and ``lakeshore controller
tick``: what the elasticity controller decided, and why."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from lakeshore.cli import context, output

Json = Annotated[bool, typer.Option("--json", help=output.JSON_HELP)]
Verbose = Annotated[
    bool, typer.Option("--verbose", "-v", help="Include tick_noop decisions (every tick).")
]
Follow = Annotated[
    bool,
    typer.Option(
        "--follow",
        "-f",
        help="Keep printing new events until Ctrl-C (with --json: one JSON object a line).",
    ),
]
Limit = Annotated[
    int,
    typer.Option(min=1, max=500, help="How many events to show (when following: per request)."),
]
FOLLOW_EVERY_S = 2.0
TIMES = "\u00d7"  # the multiplication sign before a folded row's count
MAX_PAGES_PER_POLL = 1_000

pools = typer.Typer(help="Shared pools: queues that scale as one.", no_args_is_help=True)
controller = typer.Typer(help="The elasticity controller.", no_args_is_help=True)


def _row(event: dict[str, Any]) -> list[Any]:
    before = event.get("before") or {}
    when = event["createdAt"][:19].replace("T", " ")
    repeats = event.get("repeats") or 1
    if repeats > 1:  # identical no-ops folded into one row: first and last time, and how many
        when = f"{when} → {event['lastAt'][11:19]} {TIMES}{repeats}"
    return [
        when,
        event["queueName"],
        event["action"],
        "/".join(str(before.get(k, "")) for k in ("daemon_count", "in_flight", "pending")),
        event["reason"],
    ]


COLUMNS = ["when (UTC)", "scope", "action", "daemons/in flight/pending", "reason"]


def _show(
    cli: context.CliContext, path: str, verbose: bool, follow: bool, limit: int, as_json: bool
) -> None:
    params: dict[str, Any] = {"verbose": verbose, "limit": limit}
    page = cli.client.request("GET", path, params=params)
    events = list(reversed(page["events"]))  # oldest first, like a log
    if as_json and not follow:
        output.data(page)
        return
    if not follow:
        if not events:
            output.note("no events yet" + ("" if verbose else " (add --verbose for no-ops)"))
        output.table(COLUMNS, [_row(e) for e in events])
        return
    last = events[-1]["id"] if events else 0
    try:
        _print_lines(events, as_json)
        while True:
            time.sleep(FOLLOW_EVERY_S)
            newer, complete = _newer(cli, path, params, last)
            if not complete:
                output.note("more new events than one poll can fetch; some were skipped")
            _print_lines(newer, as_json)
            if newer:
                last = newer[-1]["id"]
    except KeyboardInterrupt:
        return


def _newer(
    cli: context.CliContext, path: str, params: dict[str, Any], last: int
) -> tuple[list[dict[str, Any]], bool]:
    """Every event after ``last``, oldest first, and whether that is all of them.

    The feed pages newest first, so this starts at the newest and follows ``next_cursor``
    back down to ``last``: a burst of more than a page between two polls is not lost.
    Events written meanwhile are newer than the first page's newest; the next poll gets
    them."""
    found: list[dict[str, Any]] = []
    cursor: str | None = None
    for _ in range(MAX_PAGES_PER_POLL):
        query = {**params, "since": last} | ({"cursor": cursor} if cursor else {})
        page = cli.client.request("GET", path, params=query)
        found.extend(page["events"])
        cursor = page["next_cursor"]
        if cursor is None:
            return list(reversed(found)), True
    return list(reversed(found)), False


def _print_lines(events: list[dict[str, Any]], as_json: bool) -> None:
    """One line per event: JSON or YAML (for scripts, flushed as it comes) or a readable
    row."""
    for event in events:
        if as_json:
            output.line(event)
        else:
            output.console.print(" · ".join(str(c) for c in _row(event)), markup=False)


def queue_events(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Queue name.", show_default=False)],
    verbose: Verbose = False,
    follow: Follow = False,
    limit: Limit = 20,
    as_json: Json = False,
) -> None:
    """Show a queue's scale decisions (and its pool's), oldest first."""
    cli = context.get(ctx)
    _show(cli, cli.ns_path("queues", name, "events"), verbose, follow, limit, as_json)


def explain(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Queue name.", show_default=False)],
    as_json: Json = False,
) -> None:
    """Why did (or didn't) the queue scale? The latest decision, its rule and signals, and
    what would have to change."""
    cli = context.get(ctx)
    data = cli.client.request("GET", cli.ns_path("queues", name, "explain"))
    if as_json:
        output.data(data)
        return
    now, policy, latest = data["now"], data["policy"], data["latest"]
    bounds = f"min {policy['min']}, max {'unset' if policy['max'] is None else policy['max']}"
    if policy.get("wait_s") is not None:
        bounds += f", wait {policy['wait_s']:g} s"
    if policy.get("max_step") != 1:
        step = policy.get("max_step")
        bounds += f", max step {'none' if step is None else step}"
    pool = data.get("pool")
    lines = [f"queue {data['queue']} ({data['state']}), ticked as {data['scope']}"]
    if pool:
        lines += [
            f"in pool {pool['name']} (members: {', '.join(pool['members'])}); "
            f"the pool's feed is {pool['feed']}",
            f"the pool follows the policy of {pool['policyFrom']} and launches through "
            f"the provider of {pool['providerFrom']}",
            *(f"  note: {line}" for line in pool["disagreements"]),
        ]
    lines += [
        f"policy: {policy['kind']}, {bounds}; provider: {data['provider'] or 'none'}",
        f"now: {now['daemonCount']} daemons, {now['inFlight']} launching, "
        f"{now['pending']} pending, {now['running']} running, "
        f"utilization {now['utilization']:.2f}",
    ]
    lines += [  # the queue's periodic schedules
        f"schedule {s['name']}: next slot {s['next_slot'] or 'none (paused)'}"
        for s in now.get("schedules", [])
    ]
    if latest is not None:
        lines += [
            f"latest decision ({data['ageSeconds']:g} s ago): {latest['action']}",
            f"  reason: {latest['reason']}",
            f"  rule: {latest['rule']}",
        ]
        estimates = (latest.get("detail") or {}).get("estimates")
        if estimates:
            lines.append(f"  estimates: {_estimates(estimates)}")
    lines.append(f"why: {data['why']}")
    for line in lines:
        output.console.print(line, markup=False, highlight=False)


def _estimates(estimates: dict[str, Any]) -> str:
    """A wait_target decision's estimates on one line: each value with its source."""
    parts = []
    for name, value in estimates.items():
        if isinstance(value, dict) and "value" in value:
            source = f" ({value['source']})" if value.get("source") else ""
            parts.append(f"{name} {value['value']}{source}")
        else:
            parts.append(f"{name} {value}")
    return ", ".join(parts)


@pools.command("events")
def pool_events(
    ctx: typer.Context,
    pool: Annotated[str, typer.Argument(help="Pool name.", show_default=False)],
    verbose: Verbose = False,
    follow: Follow = False,
    limit: Limit = 20,
    as_json: Json = False,
) -> None:
    """Show a pool's scale decisions, oldest first."""
    cli = context.get(ctx)
    _show(cli, cli.ns_path("pools", pool, "events"), verbose, follow, limit, as_json)


@controller.command("tick")
def tick(ctx: typer.Context, as_json: Json = False) -> None:
    """Run one elasticity tick now (admin token) and show its decisions."""
    cli = context.get(ctx)
    data = cli.client.request("POST", "/v1/admin/elasticity/tick")
    if as_json:
        output.data(data)
        return
    rows = [
        [d["namespace"], d["queueName"], d["action"], d["reason"], d["rule"], d["hint"]]
        for d in data["decisions"]
    ]
    if not rows:
        output.note("no active queues to tick")
    output.table(["namespace", "scope", "action", "reason", "rule", "hint"], rows, wide=2)


def register(queues: typer.Typer) -> None:
    queues.command("events")(queue_events)
    queues.command("explain")(explain)
