"""``lakeshore simulate``: what would these policies have done with this workload?

The queues of a ``lakeshore.yaml`` (the file ``lakeshore apply`` reads) are each played
against the same workload and the same fleet model by :mod:`lakeshore.elasticity.simulate`,
which runs the controller's own plan every tick on a virtual clock. The workload is
synthetic (``--arrivals`` and ``--service``) or a queue's own history read from a server
(``--from-server --queue Q --since 24h``). See docs/simulate.md.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from math import inf
from pathlib import Path
from typing import Any, Final

import typer
from rich.table import Table

from lakeshore.cli import context, output
from lakeshore.cli.apply import read_file
from lakeshore.cli.apply_file import FileInvalid, load
from lakeshore.cli.client import CliError
from lakeshore.cli.context import CliContext
from lakeshore.cli.feed import TIMES
from lakeshore.domain.queue import READ_ONLY_FIELDS, QueueSpec, parse_spec
from lakeshore.elasticity import hindsight
from lakeshore.elasticity.simulate import RELAUNCH_S, Fleet, Report, SimulationError
from lakeshore.elasticity.simulate import simulate as play
from lakeshore.elasticity.workload import (
    Arrivals,
    Dist,
    WorkloadError,
    replayed,
    seconds,
    synthetic,
)
from lakeshore.errors import InvalidInput

MAX_INVOCATIONS: Final = 5_000_000  # a larger workload is refused before it is drawn
MAX_TICKS: Final = 1_000_000
HISTORY_PAGE: Final = 1_000
PLOT_SUFFIXES: Final = (".png", ".svg")


@dataclass(frozen=True)
class Workload:
    """What every policy is played against, and where it came from."""

    source: dict[str, Any]
    work: list[tuple[float, float]]
    duration_s: float


def _bad(param: str, message: str) -> typer.BadParameter:
    return typer.BadParameter(message, param_hint=param)


def _dist(param: str, text: str) -> Dist:
    try:
        return Dist.parse(text)
    except WorkloadError as exc:
        raise _bad(param, str(exc)) from None


def _seconds(param: str, text: str) -> float:
    try:
        value = seconds(text)
    except WorkloadError as exc:
        raise _bad(param, str(exc)) from None
    if value <= 0:
        raise _bad(param, f"{text!r}: must be more than 0 seconds")
    return value


def _file_specs(path: str, wanted: list[str]) -> list[QueueSpec]:
    text, label = read_file(path)
    try:
        parsed = load(text, label)
    except FileInvalid as exc:
        raise CliError("\n".join(exc.messages())) from None
    specs = [q.spec for q in parsed.queues]
    if not specs:
        raise CliError(f"{label}: no queues to simulate (a `queues:` list is needed)")
    if wanted:
        names = {s.name for s in specs}
        missing = [name for name in wanted if name not in names]
        if missing:
            raise CliError(
                f"{label}: no queue named {', '.join(missing)} "
                f"(the file has {', '.join(sorted(names))})"
            )
        specs = [s for s in specs if s.name in wanted]
    return specs


def _server_spec(cli: CliContext, name: str) -> QueueSpec:
    record = cli.client.request("GET", cli.ns_path("queues", name))
    try:
        return parse_spec({k: v for k, v in record.items() if k not in READ_ONLY_FIELDS})
    except InvalidInput as exc:
        raise CliError(f'the server\'s queue "{name}" cannot be simulated: {exc}') from None


def _when(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


def _history(cli: CliContext, name: str, since_s: float, service: Dist, seed: int) -> Workload:
    """The queue's invocations submitted in the last ``since_s`` seconds, newest first
    page by page until an older one: submit offsets and run times (an attempt's start to
    its finish; ``--service`` draws the run time of those not finished)."""
    end = datetime.now(UTC)
    start = end - timedelta(seconds=since_s)
    path = cli.ns_path("queues", name, "invocations")
    history: list[tuple[float, float | None]] = []
    query: dict[str, Any] = {"limit": HISTORY_PAGE}
    known = 0
    while True:
        page = cli.client.request("GET", path, params=query)
        older = False
        for row in page["invocations"]:
            created = _when(row["created_at"])
            if created is None or created < start:
                older = True
                break
            began, ended = _when(row["started_at"]), _when(row["finished_at"])
            run_s = (ended - began).total_seconds() if began and ended else None
            known += run_s is not None
            history.append(((created - start).total_seconds(), run_s))
            if len(history) > MAX_INVOCATIONS:
                raise CliError(f"more than {MAX_INVOCATIONS:,} invocations; ask for less --since")
        cursor = page.get("next_cursor")
        if older or not cursor:
            break
        query["cursor"] = cursor
    work = replayed(history, service, random.Random(seed))
    source = {
        "kind": "server",
        "queue": name,
        "from": start.isoformat(),
        "to": end.isoformat(),
        "invocations": len(history),
        "runTimesKnown": known,
    }
    return Workload(source, work, since_s)


def _synthetic(arrivals: str, service: Dist, duration_s: float, seed: int) -> Workload:
    try:
        pattern = Arrivals.parse(arrivals)
    except WorkloadError as exc:
        raise _bad("--arrivals", str(exc)) from None
    if pattern.most(duration_s) > MAX_INVOCATIONS:
        raise _bad(
            "--arrivals",
            f"{arrivals!r} over {duration_s:,.0f} s is more than {MAX_INVOCATIONS:,} "
            "invocations; lower the rate or the --duration",
        )
    work = synthetic(pattern, service, duration_s, random.Random(seed))
    source = {"kind": "synthetic", "arrivals": arrivals, "invocations": len(work)}
    return Workload(source, work, duration_s)


_ROWS: Final = (
    ("policy", "kind", "{}"),
    ("invocations", "invocations", "{:,}"),
    ("started", "served", "{:,}"),
    ("left unfinished", "unfinished", "{:,}"),
    ("daemon-hours", "daemon_hours", "{:,.1f}"),
    ("cost", "cost", "{:,.2f}"),
    ("wait p50", "wait_p50_s", "{:,.1f} s"),
    ("wait p95", "wait_p95_s", "{:,.1f} s"),
    ("wait max", "wait_max_s", "{:,.1f} s"),
    ("launches", "launches", "{:,}"),
    ("kills", "kills", "{:,}"),
    ("thrash (kill soon after launch)", "thrash", "{:,}"),
    (f"relaunches ({RELAUNCH_S / 60:.0f} min)", "relaunches", "{:,}"),
    ("peak daemons", "peak_daemons", "{:,}"),
    ("ticks at a bound", "at_bound", "{:.1%}"),
    ("ended at", "ended_s", "{:,.0f} s"),
    ("decision rows", "decisions", "{}"),
)


def _table(reports: list[Report], workload: Workload, against: Against | None = None) -> None:
    source = workload.source
    what = (
        f"{source['arrivals']}"
        if source["kind"] == "synthetic"
        else f"queue {source['queue']} from {source['from']}"
    )
    title = f"{source['invocations']:,} invocations ({what}) over {workload.duration_s:,.0f} s"
    out = Table("", *(r.queue for r in reports), title=title, header_style="bold")
    summaries = [r.summary() for r in reports]
    for label, key, shape in _ROWS:
        cells = []
        for summary in summaries:
            value = summary[key]
            cells.append(str(len(value)) if key == "decisions" else shape.format(value))
        out.add_row(label, *cells)
    if against is not None:
        target = f"{against.target_s:g} s"
        scores = against.scores
        out.add_row(f"5-min windows p95 <= {target}", *(f"{s.windows_met:.1%}" for s in scores))
        out.add_row(
            "… where hindsight met it", *(f"{s.met_where_baseline_met:.1%}" for s in scores)
        )
        out.add_row(
            "daemon-hours / hindsight",
            *(f"{s.over_floor:.2f}x" if s.over_floor != inf else "-" for s in scores),
        )
    output.console.print(out)


def _decisions(report: Report) -> None:
    output.console.print(f"[bold]decisions of {report.queue}[/bold] ({report.kind})")
    for row in report.decisions:
        span = f"{row['t']:>9.0f} s"
        if row["repeats"] > 1:
            span += f" → {row['last_t']:.0f} s {TIMES}{row['repeats']}"
        line = f"{span} · {row['action']} · {row['reason']} [{row['rule']}]"
        output.console.print(line, markup=False, highlight=False, soft_wrap=True)


def _plot(path: Path, reports: list[Report]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise CliError("--plot needs matplotlib: pip install 'lakeshore-queues[plot]'") from None
    figure, axes = plt.subplots(3, 1, sharex=True, figsize=(10, 7), dpi=80, layout="constrained")
    for report in reports:
        hours = [row[0] / 3_600 for row in report.timeline]
        label = f"{report.queue} ({report.kind})"
        for axis, column in zip(axes, (1, 2, 3), strict=True):
            values = [row[column] for row in report.timeline]
            axis.step(hours, values, where="post", label=label, linewidth=0.8, alpha=0.85)
    for axis, name in zip(axes, ("pending", "running", "daemons"), strict=True):
        axis.set_ylabel(name)
        axis.grid(alpha=0.3)
    axes[0].legend(loc="upper right")
    axes[-1].set_xlabel("hours")
    figure.suptitle("lakeshore simulate")
    try:
        figure.savefig(path)
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        plt.close(figure)


def _replay(
    ctx: typer.Context,
    file: str | None,
    wanted: list[str],
    arrivals: str | None,
    since: str,
    service: Dist,
    seed: int,
) -> tuple[list[QueueSpec], Workload]:
    if arrivals is not None:
        raise _bad("--arrivals", "give --arrivals or --from-server, not both")
    if len(wanted) != 1:
        raise _bad("--queue", "--from-server replays one queue: give --queue NAME once")
    cli = context.get(ctx)
    since_s = _seconds("--since", since)
    specs = _file_specs(file, []) if file else [_server_spec(cli, wanted[0])]
    return specs, _history(cli, wanted[0], since_s, service, seed)


def run(
    ctx: typer.Context,
    *,
    file: str | None,
    queue: list[str] | None,
    arrivals: str | None,
    service: str,
    duration: str,
    boot: str,
    capacity: int | None,
    cost_per_hour: float,
    interval: float,
    daemons: int | None,
    seed: int,
    from_server: bool,
    since: str,
    plot: Path | None,
    drain: bool,
    decisions: bool,
    as_json: bool,
    target_wait: str | None = None,
) -> None:
    """``lakeshore simulate`` (its options are declared in
    ``lakeshore.cli.simulate_command``)."""
    service_dist, boot_dist = _dist("--service", service), _dist("--boot", boot)
    target_s = _seconds("--target-wait", target_wait) if target_wait is not None else None
    if plot is not None and plot.suffix.lower() not in PLOT_SUFFIXES:
        raise _bad("--plot", f"{plot}: the file must end in .png or .svg")
    wanted = list(queue or [])
    if from_server:
        specs, workload = _replay(ctx, file, wanted, arrivals, since, service_dist, seed)
    else:
        if file is None:
            raise _bad("--file", "name the queues to simulate with -f FILE (or --from-server)")
        if arrivals is None:
            raise _bad("--arrivals", "a synthetic workload needs --arrivals (or --from-server)")
        duration_s = _seconds("--duration", duration)
        specs = _file_specs(file, wanted)
        workload = _synthetic(arrivals, service_dist, duration_s, seed)
    if workload.duration_s / interval > MAX_TICKS:
        raise _bad("--interval", f"more than {MAX_TICKS:,} ticks; raise it or shorten the time")
    fleet = Fleet(
        boot=boot_dist,
        capacity=capacity,
        cost_per_hour=cost_per_hour,
        interval_s=interval,
        initial=daemons,
    )
    reports = []
    for spec in specs:
        try:  # each policy meets the same boot delays: one seed, drawn afresh
            reports.append(
                play(
                    spec,
                    workload.work,
                    fleet,
                    duration_s=workload.duration_s,
                    rng=random.Random(seed),
                    drain=drain,
                )
            )
        except SimulationError as exc:
            raise CliError(str(exc)) from None
    if plot is not None:
        _plot(plot, reports)
    against = _against(reports, workload, specs, fleet, target_s) if target_s else None
    _print(
        reports,
        workload,
        fleet,
        boot=boot,
        plot=plot,
        decisions=decisions,
        as_json=as_json,
        against=against,
    )


@dataclass(frozen=True)
class Against:
    """The wait target, the hindsight baseline, and each policy's score against both."""

    target_s: float
    floor: hindsight.Baseline
    scores: list[hindsight.Score]

    def to_json(self) -> dict[str, Any]:
        return {
            "targetWaitS": self.target_s,
            "hindsight": {
                "daemonHours": round(self.floor.daemon_hours, 4),
                "windowsMet": round(len(self.floor.met) / max(1, self.floor.windows), 4),
                "fleetPerHour": list(self.floor.fleet),
            },
            "policies": [
                {
                    "windowsMet": round(s.windows_met, 4),
                    "metWhereHindsightMet": round(s.met_where_baseline_met, 4),
                    "overHindsight": round(s.over_floor, 4) if s.over_floor != inf else None,
                }
                for s in self.scores
            ],
        }


def _against(
    reports: list[Report],
    workload: Workload,
    specs: list[QueueSpec],
    fleet: Fleet,
    target_s: float,
) -> Against:
    template = specs[0].daemon_template
    slots = fleet.capacity or (template.capacity if template and template.capacity else 1)
    floor = hindsight.baseline(workload.work, target_s, workload.duration_s, slots)
    scores = [hindsight.score(r.started, r.daemon_hours, target_s, floor) for r in reports]
    return Against(target_s, floor, scores)


def _print(
    reports: list[Report],
    workload: Workload,
    fleet: Fleet,
    *,
    boot: str,
    plot: Path | None,
    decisions: bool,
    as_json: bool,
    against: Against | None = None,
) -> None:
    if as_json:
        output.data(
            {
                **({"target": against.to_json()} if against is not None else {}),
                "workload": {**workload.source, "durationS": workload.duration_s},
                "fleet": {
                    "boot": boot,
                    "capacity": fleet.capacity,
                    "costPerHour": fleet.cost_per_hour,
                    "intervalS": fleet.interval_s,
                    "initial": fleet.initial,
                },
                "policies": [r.summary() for r in reports],
                "plot": str(plot) if plot is not None else None,
            }
        )
        return
    _table(reports, workload, against)
    if against is not None:
        floor = against.floor
        output.note(
            f"hindsight baseline (each hour the smallest fixed fleet meeting p95 <= "
            f"{against.target_s:g} s, no boot, no waste): {floor.daemon_hours:,.1f} "
            f"daemon-hours, {len(floor.met)} of {floor.windows} windows met"
        )
    if decisions:
        for report in reports:
            _decisions(report)
    if plot is not None:
        output.note(f"wrote {plot}")
