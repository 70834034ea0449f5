"""``lakeshore demo``: the whole product on one machine, in under a minute.

It starts ``lakeshore up`` (server, controller, ``local`` provider) on a scratch data dir
and a free port, creates an elastic queue (``fully_elastic``, ``local`` provider, min 0,
max 4), submits a few hundred invocations of an example UDF, shows the fleet growing and
draining live, prints a summary with the scale decisions and their reasons, and stops
everything it started: also when it is stopped itself, by Ctrl-C, SIGTERM (``timeout``, a
process manager) or SIGHUP (its terminal closed).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.live import Live
from rich.table import Table

from lakeshore import transport
from lakeshore.cli import output
from lakeshore.cli.client import ApiClient, CliError

QUEUE = "demo"
FN = "lakeshore.examples:render_tile"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


@dataclass
class Progress:
    total: int
    started: float = field(default_factory=time.monotonic)
    peak: int = 0
    now: dict[str, Any] = field(default_factory=dict)
    latest: str = ""

    @property
    def finished(self) -> int:
        by_state = self.now.get("byState", {})
        return int(by_state.get("succeeded", 0) + by_state.get("failed", 0))

    @property
    def settled(self) -> bool:
        """Every invocation done and the fleet back to zero."""
        return (
            self.finished >= self.total
            and self.now.get("daemonCount") == 0
            and self.now.get("inFlight") == 0
        )

    def table(self) -> Table:
        view = Table(title=f"lakeshore demo — queue {QUEUE!r}", show_header=False, box=None)
        view.add_column(style="bold")
        view.add_column()
        now = self.now
        view.add_row("elapsed", f"{time.monotonic() - self.started:5.1f} s")
        view.add_row("done", f"{self.finished} / {self.total}")
        view.add_row("pending / running", f"{now.get('pending', '?')} / {now.get('running', '?')}")
        bar = "█" * int(now.get("daemonCount", 0)) + "·" * int(now.get("inFlight", 0))
        view.add_row(
            "daemons",
            f"{now.get('daemonCount', '?')} (+{now.get('inFlight', '?')} booting)  {bar}",
        )
        view.add_row("peak daemons", str(self.peak))
        view.add_row("latest decision", self.latest)
        return view


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start(data_dir: Path, port: int, interval_s: float) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAKESHORE_", "ELASTICITY_"))}
    env.update(ELASTICITY_INTERVAL_S=str(interval_s), PYTHONUNBUFFERED="1")
    args = ["up", "--port", str(port), "--data-dir", str(data_dir), "--log-level", "warning"]
    log = (data_dir / "server.log").open("ab")
    return subprocess.Popen(
        [*_lakeshore_command(), *args],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,  # the demo stops it itself, cleanly
    )


def _wait_healthy(process: subprocess.Popen[bytes], url: str, data_dir: Path) -> str:
    deadline = time.monotonic() + START_TIMEOUT_S
    token_file = data_dir / "admin-token"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log = (data_dir / "server.log").read_text(errors="replace")[-2000:]
            raise CliError(f"lakeshore up exited ({process.returncode}):\n{log}")
        with (
            contextlib.suppress(transport.Unreachable, OSError),
            transport.connect(url, timeout=1) as http,
        ):
            if http.request("GET", "/healthz").status_code == 200:
                return token_file.read_text().strip()
        time.sleep(0.2)
    raise CliError(f"the demo server did not start within {START_TIMEOUT_S:.0f} s")


class Stopped(Exception):
    """The demo got SIGTERM (``timeout``, a process manager) or SIGHUP (its terminal
    closed): it stops what it started, as after Ctrl-C, and exits ``128 + signal``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stopped(signum: int, frame: object) -> None:
    raise Stopped(signum)


@contextlib.contextmanager
def _signals(handler: Any) -> Iterator[None]:
    """SIGTERM and SIGHUP (and, with ``signal.SIG_IGN``, SIGINT) go to ``handler`` in the
    block: ``lakeshore up`` runs in a session of its own, so nothing but the demo stops it
    and its daemons; by default either signal would end the demo and leave them running."""
    signums = [signal.SIGTERM, *([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])]
    if handler is signal.SIG_IGN:
        signums.append(signal.SIGINT)
    before = {signum: signal.signal(signum, handler) for signum in signums}
    try:
        yield
    finally:
        for signum, previous in before.items():
            signal.signal(signum, previous)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Ctrl-C for ``lakeshore up`` (it stops its daemons), then SIGKILL if it hangs."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def _setup(http: ApiClient, invocations: int, max_daemons: int, seconds: float) -> None:
    queue = {
        "name": QUEUE,
        "description": "lakeshore demo: renders tiles on an elastic fleet",
        "elasticity": {"kind": "fully_elastic", "min": 0, "max": max_daemons},
        "providerRef": "local",
        "daemonTemplate": {"capacity": 2},
    }
    http.request("POST", "/v1/namespaces/default/queues", json=queue)
    for first in range(0, invocations, 1000):
        batch = [
            {"fn": FN, "args": [tile], "kwargs": {"seconds": seconds}}
            for tile in range(first, min(invocations, first + 1000))
        ]
        path = f"/v1/namespaces/default/queues/{QUEUE}/invocations/batch"
        http.request("POST", path, json={"invocations": batch})


def _poll(http: ApiClient, progress: Progress) -> None:
    explain = http.request("GET", f"/v1/namespaces/default/queues/{QUEUE}/explain")
    progress.now = explain["now"]
    progress.peak = max(progress.peak, int(progress.now.get("daemonCount", 0)))
    latest = explain.get("latest")
    if latest:
        progress.latest = f"{latest['action']}: {latest['reason']}"


def _events(http: ApiClient) -> list[dict[str, Any]]:
    """The scale decisions, once the last kill's event is written (it lands just after the
    fleet reads zero)."""
    path = f"/v1/namespaces/default/queues/{QUEUE}/events"
    for _ in range(20):
        events: list[dict[str, Any]] = http.request("GET", path, params={"limit": 100})["events"]
        ups = sum(1 for e in events if e["action"] == "scale_up")
        if sum(1 for e in events if e["action"] == "scale_down") >= ups:
            break
        time.sleep(0.25)
    return events


def _summary(http: ApiClient, progress: Progress, elapsed: float) -> None:
    events = _events(http)
    by_state = progress.now.get("byState", {})
    output.console.print()
    output.console.print(
        f"[bold]{by_state.get('succeeded', 0)}[/bold] invocations succeeded, "
        f"{by_state.get('failed', 0)} failed, in {elapsed:.1f} s; "
        f"peak daemons [bold]{progress.peak}[/bold]; "
        f"daemons now {progress.now.get('daemonCount', '?')} "
        f"(+{progress.now.get('inFlight', '?')} booting)"
    )
    table = Table("at", "action", "reason", title="scale decisions")
    for event in reversed(events):
        table.add_row(event["createdAt"][11:19], event["action"], event["reason"])
    output.console.print(table)


def demo(
    invocations: Annotated[
        int, typer.Option(help="How many invocations to submit.", min=1, max=100_000)
    ] = 300,
    max_daemons: Annotated[
        int, typer.Option(help="The queue's elasticity max.", min=1, max=16)
    ] = 4,
    seconds: Annotated[
        float, typer.Option(help="Seconds each invocation takes.", min=0, max=60)
    ] = 0.2,
    timeout: Annotated[
        float, typer.Option(help="Give up after this many seconds.", min=10)
    ] = 110.0,
    keep: Annotated[
        bool, typer.Option("--keep", help="Keep the scratch data dir (logs, SQLite file).")
    ] = False,
    stay: Annotated[
        bool,
        typer.Option(
            "--stay", help="After the summary, keep serving (the dashboard) until Ctrl-C."
        ),
    ] = False,
) -> None:
    """Watch an elastic queue at work: `lakeshore up` on a scratch dir, a fully_elastic
    queue (local provider, 0 to MAX daemons), a few hundred invocations, the fleet growing
    and draining back to zero, then a summary. Everything it starts, it stops."""
    with _signals(_raise_stopped):
        try:
            _run(invocations, max_daemons, seconds, timeout, keep=keep, stay=stay)
        except Stopped as exc:
            output.note(f"{exc}: stopped the server and its daemons")
            raise typer.Exit(128 + exc.signum) from None


def _run(
    invocations: int, max_daemons: int, seconds: float, timeout: float, *, keep: bool, stay: bool
) -> None:
    scratch = Path(tempfile.mkdtemp(prefix="lakeshore-demo-"))
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    output.note(f"starting lakeshore up on {url} (data in {scratch})")
    process = None
    try:
        process = _start(scratch, port, interval_s=1.0)
        token = _wait_healthy(process, url, scratch)
        output.note(
            f"watch it in a browser: {url}/ui/ns/default/queues/{QUEUE} "
            f"(sign in with this demo's admin token: {token})"
        )
        http = ApiClient(url, token)
        try:
            _setup(http, invocations, max_daemons, seconds)
            progress = Progress(total=invocations)
            settled = _watch(http, progress, timeout)
            _summary(http, progress, time.monotonic() - progress.started)
        finally:
            http.close()
        if stay:
            _stay(url)
        if not settled:
            raise CliError(f"the demo did not settle within {timeout:.0f} s (logs: {scratch})")
    except CliError as exc:
        raise CliError(f"the demo server failed: {exc} (logs: {scratch})") from exc
    finally:
        with _signals(signal.SIG_IGN):  # bounded (STOP_TIMEOUT_S, then SIGKILL): never cut short
            if process is not None:
                _stop(process)
            if not keep:
                shutil.rmtree(scratch, ignore_errors=True)
    output.note(
        "stopped the server and its daemons" + (f"; data kept in {scratch}" if keep else "")
    )


def _stay(url: str) -> None:
    output.note(f"still serving {url}/ui; Ctrl-C stops it")
    with contextlib.suppress(KeyboardInterrupt):
        while True:
            time.sleep(3600)


def _watch(http: ApiClient, progress: Progress, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    live = output.console.is_terminal
    printed = 0.0
    with (
        Live(progress.table(), console=output.console, auto_refresh=False)
        if live
        else (contextlib.nullcontext()) as view
    ):
        while time.monotonic() < deadline:
            _poll(http, progress)
            if view is not None:
                view.update(progress.table(), refresh=True)
            elif time.monotonic() - printed >= 2:
                printed = time.monotonic()
                now = progress.now
                output.console.print(
                    f"{time.monotonic() - progress.started:5.1f}s done {progress.finished}/"
                    f"{progress.total} pending {now.get('pending')} daemons "
                    f"{now.get('daemonCount')} (+{now.get('inFlight')}) | {progress.latest}",
                    markup=False,
                    highlight=False,
                )
            if progress.settled:
                return True
            time.sleep(0.5)
    return False


def _lakeshore_command() -> list[str]:
    from lakeshore.providers.local import lakeshore_command

    return lakeshore_command()
