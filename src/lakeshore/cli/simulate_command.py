"""The ``lakeshore simulate`` command's options; its work (``lakeshore.cli.simulate``, with
the plan and the file's models) is imported only when it runs, so other commands start
faster."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lakeshore.cli import output


def simulate(
    ctx: typer.Context,
    file: Annotated[
        str | None,
        typer.Option(
            "--file",
            "-f",
            help="The queues to compare, as in lakeshore.yaml (- reads standard input). "
            "With --from-server and no file: the server's own spec of --queue.",
            show_default=False,
        ),
    ] = None,
    queue: Annotated[
        list[str] | None,
        typer.Option(
            "--queue",
            "-q",
            help="Only this queue of the file (repeatable). With --from-server: the one "
            "queue whose history is replayed.",
            show_default=False,
        ),
    ] = None,
    arrivals: Annotated[
        str | None,
        typer.Option(
            "--arrivals",
            help="Arrivals per second: constant:R, steps:R0,T1=R1,..., bursts:R,EVERY,SIZE, "
            "daily:MEAN,PEAK[,PEAK_AT] (/m or /h for per minute or hour).",
            show_default=False,
        ),
    ] = None,
    service: Annotated[
        str,
        typer.Option(
            "--service",
            help="Run time of an invocation: fixed:S, exp:MEAN, uniform:LO,HI, "
            "lognormal:MEAN,SIGMA (with --from-server: of those not finished).",
        ),
    ] = "exp:30",
    duration: Annotated[
        str, typer.Option("--duration", help="Virtual time to play (s, m, h or d).")
    ] = "24h",
    boot: Annotated[
        str, typer.Option("--boot", help="Launch to ready, a distribution as for --service.")
    ] = "fixed:30",
    capacity: Annotated[
        int | None,
        typer.Option(
            "--capacity",
            min=1,
            help="Slots per daemon (default: daemonTemplate.capacity, else 1).",
            show_default=False,
        ),
    ] = None,
    cost_per_hour: Annotated[
        float, typer.Option("--cost-per-hour", min=0, help="Cost weight of one daemon-hour.")
    ] = 1.0,
    interval: Annotated[
        float, typer.Option("--interval", min=0.1, help="Controller tick interval, seconds.")
    ] = 5.0,
    daemons: Annotated[
        int | None,
        typer.Option(
            "--daemons",
            min=0,
            help="Daemons running at the start (default: the policy's min).",
            show_default=False,
        ),
    ] = None,
    target_wait: Annotated[
        str | None,
        typer.Option(
            "--target-wait",
            help="A p95 wait target (s, m or h): report each policy's share of 5-minute "
            "windows meeting it, and its daemon-hours over the hindsight baseline's (each "
            "hour, the smallest fixed fleet meeting it, with no boot and no waste).",
            show_default=False,
        ),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of every random draw.")] = 0,
    from_server: Annotated[
        bool,
        typer.Option("--from-server", help="Replay a queue's history read from the server."),
    ] = False,
    since: Annotated[
        str, typer.Option("--since", help="With --from-server: how far back to read.")
    ] = "24h",
    plot: Annotated[
        Path | None,
        typer.Option(
            "--plot",
            help="Write pending, running and daemons over time to this .png or .svg file.",
            show_default=False,
            dir_okay=False,
        ),
    ] = None,
    drain: Annotated[
        bool,
        typer.Option(
            "--drain/--no-drain",
            help="Run on past the end (no more arrivals) until the work is done, so every "
            "policy is charged for finishing the same work; --no-drain stops at the end.",
        ),
    ] = True,
    decisions: Annotated[
        bool, typer.Option("--decisions", help="List each policy's decisions, as the feed does.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help=output.JSON_HELP)] = False,
) -> None:
    """Play queue policies against one workload with the controller's own plan.

    Every queue of the file meets the same arrivals and run times on a
    virtual clock (a day of 5-second ticks takes seconds) and is reported
    side by side: daemon-hours and cost, waits, launches and kills, peak
    daemons, ticks at a bound, decisions. See docs/simulate.md.

    lakeshore simulate -f lakeshore.yaml --arrivals bursts:0.02,4h,100 --target-wait 300s

    lakeshore simulate --from-server -q gpu --since 24h --plot day.png
    """
    from lakeshore.cli import simulate as simulating

    simulating.run(
        ctx,
        file=file,
        queue=queue,
        arrivals=arrivals,
        service=service,
        duration=duration,
        boot=boot,
        capacity=capacity,
        cost_per_hour=cost_per_hour,
        interval=interval,
        daemons=daemons,
        seed=seed,
        target_wait=target_wait,
        from_server=from_server,
        since=since,
        plot=plot,
        drain=drain,
        decisions=decisions,
        as_json=as_json,
    )
