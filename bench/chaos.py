"""Chaos benchmark: kill -9 of daemons and server replicas while work runs.

Starts ``--replicas`` ``lakeshore server`` processes on one fresh PostgreSQL database and
``--daemons`` ``lakeshore daemon run --capacity 4`` processes (daemon i talks to replica
i mod replicas: d1 and d3 to A, d2 to B), submits ``--count`` invocations of
``bench.chaos_udf:record_run`` (each run of its body appends to a ledger file) in
batches that keep about ``--backlog`` unfinished, alternating replicas and failing over
to the other one, and every ``--kill-every-s`` seconds kills one process with SIGKILL:
two daemons, then a replica, in turn (which one is drawn with ``--seed``). A killed
daemon is started again ``--daemon-restart-s`` later (a new worker id, the same
replica), a killed replica ``--replica-restart-s`` later on its own port, as a
supervisor would. No kill comes once everything is submitted and fewer than
``--backlog`` invocations are unfinished, so each kill's recovery can be seen.

``--prefetch N`` gives each daemon ``--prefetch N`` (work claimed ahead of a free slot,
held under lease: what a crash must not charge). ``--poison-pills N`` spreads N
invocations of ``bench.chaos_pill:kill_daemon`` over the work, each with
``--pill-attempts`` attempts: each run kills the daemon running it with SIGKILL, and the
daemon is started again ``--daemon-restart-s`` later, as after a kill. A pill must end
``failed`` once its attempts are spent, and the rest must not pay for it.

What the store accepted is read from the database itself: before any work is submitted
a trigger is put on the ``invocations`` table that logs every change of an
invocation's state, and every write of its ``finished_at`` (each recorded outcome sets
it), to a table of the bench's own. It prints:

- **submitted**: invocations the server acknowledged (ids in a batch's answer);
- **succeeded**: of those, read back over the HTTP API as ``succeeded`` with their own
  argument as result;
- **lost**: submitted and not succeeded so (missing, failed, still pending, a wrong
  result);
- **completed twice**: invocations for which the store accepted a result more than once
  (two or more logged writes into ``succeeded``);
- **ran twice**: invocations whose body started more than once (the ledger), and how
  many of them were held, at a kill, by the killed daemon or by a daemon of the killed
  replica (at-least-once: expected only for those);
- **attempts charged beyond the runs**: for each invocation, the attempts the store
  counted beyond the runs of its body that started (the ledger), summed: an attempt
  charged to work that never began;
- the poison pills: how many ended ``failed`` with all their attempts spent, and how many
  daemons they took down;
- the recovery time of each kill (see ``Kill`` for the definitions).

Usage (from the repository root)::

    .venv/bin/python bench/chaos.py [--count 10000] [--kill-every-s 15] [--seed 1]

The lakeshore it runs is the one in the tree this file is in (``src/`` first on the
processes' ``PYTHONPATH``), so a ``git worktree`` of a commit runs that commit. Exit
status 0 when nothing was lost or completed twice, 1 when something was, 2 when the run
itself failed, 130 when interrupted. Every process it starts is stopped, and the
scratch database dropped, before it returns: also on failure, Ctrl-C or SIGTERM. Logs
and the ledger stay in a temp dir (printed) when the run fails, or with ``--keep``.
Results and what exactly is counted: ``docs/reliability.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import random
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg

ROOT = Path(__file__).resolve().parents[1]
LAKESHORE = Path(sys.executable).parent / "lakeshore"
if not LAKESHORE.exists():
    LAKESHORE = ROOT / ".venv" / "bin" / "lakeshore"
PG_SERVER = "postgresql://postgres@127.0.0.1:5432/test"
NS = "/v1/namespaces/default"
QUEUE = "chaos"
UDF_MODULE = "bench.chaos_udf"
UDF = f"{UDF_MODULE}:record_run"
PILL = "bench.chaos_pill:kill_daemon"
CAPACITY = 4
BATCH = 200
STARTUP_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
SUBMIT_GIVE_UP_S = 180.0
FINAL = ("succeeded", "failed", "cancelled", "expired")
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

# The store's own record of every outcome: one row per change of state, and per write of
# finished_at (complete and fail set it), committed with the change that made it.
TRANSITION_LOG = """
CREATE TABLE chaos_transitions (
    seq bigserial PRIMARY KEY,
    invocation_id text NOT NULL,
    old_state text NOT NULL,
    new_state text NOT NULL,
    worker_id text,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE FUNCTION chaos_log_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO chaos_transitions (invocation_id, old_state, new_state, worker_id)
    VALUES (NEW.id, OLD.state, NEW.state, coalesce(NEW.worker_id, OLD.worker_id));
    RETURN NULL;
END $$;
CREATE TRIGGER chaos_log_transition AFTER UPDATE ON invocations FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state OR OLD.finished_at IS DISTINCT FROM NEW.finished_at)
    EXECUTE FUNCTION chaos_log_transition();
"""


class BenchError(Exception):
    pass


class Interrupted(BaseException):
    """SIGTERM or SIGHUP: unwind like Ctrl-C, so every process is stopped."""


# --- processes ---------------------------------------------------------------------------


def clean_env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAKESHORE_", "ELASTICITY_"))}
    env["PYTHONUNBUFFERED"] = "1"
    # this tree's lakeshore (src/) and its bench.chaos_udf, before any installed one
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    env.update(overrides)
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Proc:
    role: str  # "replica" or "daemon"
    slot: int
    generation: int
    popen: subprocess.Popen[bytes]
    log: Path
    port: int = 0  # a replica's
    replica: int = 0  # a daemon's: the replica slot it talks to
    worker_id: str = ""  # a daemon's (given with --id)

    @property
    def name(self) -> str:
        if self.role == "replica":
            return f"replica {LETTERS[self.slot]}"
        return f"daemon d{self.slot + 1}"

    def alive(self) -> bool:
        return self.popen.poll() is None


def _spawn(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            args,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches this script only; it stops the rest
        )


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


class Cluster:
    """The replicas and daemons, as they are now and every one ever started."""

    def __init__(self, workdir: Path, db_url: str, token: str, opts: argparse.Namespace):
        self.workdir, self.db_url, self.token, self.opts = workdir, db_url, token, opts
        self.ports = [free_port() for _ in range(opts.replicas)]
        self.replicas: list[Proc | None] = [None] * opts.replicas
        self.daemons: list[Proc | None] = [None] * opts.daemons
        self.every: list[Proc] = []
        self.generations: Counter[tuple[str, int]] = Counter()

    def url(self, slot: int) -> str:
        return f"http://127.0.0.1:{self.ports[slot]}"

    def start_replica(self, slot: int, *, wait: bool = True) -> Proc:
        """Start replica ``slot`` on its port; with ``wait``, until ``/healthz`` answers."""
        generation = self._next("replica", slot)
        env = clean_env(
            LAKESHORE_ADMIN_TOKEN=self.token,
            LAKESHORE_LEASE_S=str(self.opts.lease_s),
            LAKESHORE_NODE_ID=f"replica-{LETTERS[slot].lower()}",
        )
        args = [str(LAKESHORE), "server", "--host", "127.0.0.1", "--port", str(self.ports[slot])]
        args += ["--db", self.db_url, "--data-dir", str(self.workdir / f"data-{slot}")]
        args += ["--log-level", "warning"]
        log = self.workdir / f"replica-{LETTERS[slot]}.log"
        proc = Proc("replica", slot, generation, _spawn(args, log, env), log, port=self.ports[slot])
        self.replicas[slot] = proc
        self.every.append(proc)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while wait and not self.healthy(proc):
            if not proc.alive():
                raise BenchError(f"{proc.name} exited {proc.popen.returncode}:\n{_tail(proc.log)}")
            if time.monotonic() > deadline:
                raise BenchError(f"{proc.name} not healthy in {STARTUP_TIMEOUT_S:.0f} s")
            time.sleep(0.05)
        return proc

    def healthy(self, proc: Proc) -> bool:
        try:
            return httpx.get(f"{self.url(proc.slot)}/healthz", timeout=0.5).status_code == 200
        except httpx.TransportError:
            return False

    def start_daemon(self, slot: int) -> Proc:
        generation = self._next("daemon", slot)
        replica = slot % self.opts.replicas
        worker_id = f"chaos-d{slot + 1}-{generation}"
        env = clean_env(LAKESHORE_URL=self.url(replica), LAKESHORE_TOKEN=self.token)
        args = [str(LAKESHORE), "daemon", "run", "--queue", QUEUE, "--capacity", str(CAPACITY)]
        args += ["--id", worker_id, "--preload", UDF_MODULE]
        if self.opts.prefetch:
            args += ["--prefetch", str(self.opts.prefetch)]
        log = self.workdir / f"daemon-d{slot + 1}.log"
        popen = _spawn(args, log, env)
        proc = Proc("daemon", slot, generation, popen, log, replica=replica, worker_id=worker_id)
        self.daemons[slot] = proc
        self.every.append(proc)
        return proc

    def _next(self, role: str, slot: int) -> int:
        self.generations[role, slot] += 1
        return self.generations[role, slot]

    def attached(self, replica: int) -> list[Proc]:
        """The live daemons that talk to replica ``replica``."""
        return [d for d in self.daemons if d is not None and d.replica == replica and d.alive()]

    def slots_of(self, replica: int) -> list[int]:
        """The daemon slots that talk to replica ``replica``."""
        return [slot for slot in range(self.opts.daemons) if slot % self.opts.replicas == replica]

    def stop_all(self, *, graceful: bool) -> None:
        """Daemons first (SIGTERM when ``graceful``: they say bye; else SIGKILL), then the
        replicas (SIGTERM); whatever outlives its bounded wait gets SIGKILL."""
        daemons = [p for p in self.every if p.role == "daemon" and p.alive()]
        _signal_and_wait(daemons, signal.SIGTERM if graceful else signal.SIGKILL)
        _signal_and_wait([p for p in self.every if p.alive()], signal.SIGTERM)


def _signal_and_wait(procs: list[Proc], sig: signal.Signals) -> None:
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            proc.popen.send_signal(sig)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for proc in procs:
        try:
            proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.popen.kill()
            proc.popen.wait(timeout=STOP_TIMEOUT_S)


@contextlib.contextmanager
def scratch_database(server_url: str) -> Iterator[str]:
    name = f"lakeshore_chaos_{secrets.token_hex(4)}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield server_url.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with shielded(), psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """Cleanup that a second Ctrl-C (or SIGTERM) cannot cut short."""
    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    before = {sig: signal.signal(sig, signal.SIG_IGN) for sig in sigs}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


# --- the database, as the bench watches it -----------------------------------------------


class Database:
    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)

    def close(self) -> None:
        self.conn.close()

    def install_transition_log(self) -> None:
        self.conn.execute(TRANSITION_LOG)

    def counts(self) -> Counter[str]:
        rows = self.conn.execute("SELECT state, count(*) FROM invocations GROUP BY state")
        return Counter({state: int(n) for state, n in rows.fetchall()})

    def held_by(self, workers: list[str]) -> list[str]:
        rows = self.conn.execute(
            "SELECT id FROM invocations WHERE state = 'running' AND worker_id = ANY(%s)",
            (workers,),
        )
        return [str(r[0]) for r in rows.fetchall()]

    def transitions(self) -> list[Transition]:
        rows = self.conn.execute(
            "SELECT invocation_id, old_state, new_state, worker_id, extract(epoch FROM at)"
            " FROM chaos_transitions ORDER BY seq"
        )
        return [Transition(i, o, n, w, float(at)) for i, o, n, w, at in rows.fetchall()]


@dataclass(frozen=True)
class Transition:
    invocation: str
    old: str
    new: str
    worker: str | None
    at: float  # epoch seconds (the database's clock, the same host's)


# --- submitting --------------------------------------------------------------------------


class Producer(threading.Thread):
    """Submits the ``count`` invocations in batches of ``BATCH`` with keys (a retried
    batch is answered with the invocations it already made), keeping about ``backlog``
    unfinished; alternates replicas and tries the other one when a request fails."""

    def __init__(
        self,
        urls: list[str],
        token: str,
        ledger: Path,
        opts: argparse.Namespace,
        unfinished: Callable[[int], int],
    ) -> None:
        super().__init__(name="producer", daemon=True)
        self.urls, self.token, self.ledger, self.opts = urls, token, ledger, opts
        self.unfinished = unfinished
        self.ids: dict[int, str] = {}  # n -> invocation id, as acknowledged
        self.pills: dict[int, str] = {}  # the poison pills' ids, by the n they precede
        every = opts.count // (opts.poison_pills + 1) if opts.poison_pills else 0
        self.pill_at = {every * (k + 1) for k in range(opts.poison_pills)}
        self.retries = 0
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.halt = threading.Event()
        draw = random.Random(f"{opts.seed}-work")
        self.work_s = [round(draw.uniform(0, 2 * opts.work_s), 3) for _ in range(opts.count)]

    def run(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        clients = [httpx.Client(base_url=u, headers=headers, timeout=15) for u in self.urls]
        try:
            self._submit_all(clients)
            self.done.set()
        except BaseException as exc:
            self.error = exc
        finally:
            for client in clients:
                client.close()

    def _submit_all(self, clients: list[httpx.Client]) -> None:
        n, turn = 0, 0
        while n < self.opts.count and not self.halt.is_set():
            if self.unfinished(len(self.ids)) >= self.opts.backlog:
                self.halt.wait(0.2)
                continue
            numbers = range(n, min(n + BATCH, self.opts.count))
            pills = [k for k in numbers if k in self.pill_at]
            items = [self._pill(k) for k in pills] + [self._item(k) for k in numbers]
            answer = self._post(clients, turn, items)
            if len(answer) != len(items):
                raise BenchError(f"a batch of {len(items)} was answered with {len(answer)}")
            for k, invocation in zip(pills, answer, strict=False):
                self.pills[k] = str(invocation["id"])
            for k, invocation in zip(numbers, answer[len(pills) :], strict=True):
                self.ids[k] = str(invocation["id"])
            n, turn = numbers.stop, turn + 1

    def _pill(self, n: int) -> dict[str, Any]:
        return {
            "fn": PILL,
            "args": [str(self.ledger), n],
            "key": f"chaos-pill-{n}",
            "max_attempts": self.opts.pill_attempts,
        }

    def _item(self, n: int) -> dict[str, Any]:
        return {
            "fn": UDF,
            "args": [str(self.ledger), n, self.work_s[n]],
            "key": f"chaos-{n}",
            "max_attempts": self.opts.max_attempts,
        }

    def _post(
        self, clients: list[httpx.Client], turn: int, items: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        give_up = time.monotonic() + SUBMIT_GIVE_UP_S
        for attempt in range(10_000):
            client = clients[(turn + attempt) % len(clients)]
            try:
                response = client.post(
                    f"{NS}/queues/{QUEUE}/invocations/batch", json={"invocations": items}
                )
            except httpx.TransportError:
                response = None
            if response is not None and response.status_code in (200, 201):
                invocations: list[dict[str, Any]] = response.json()["invocations"]
                return invocations
            if response is not None and response.status_code < 500 and response.status_code != 429:
                raise BenchError(f"submit refused: {response.status_code} {response.text[:300]}")
            self.retries += 1
            if time.monotonic() > give_up or self.halt.wait(0.3):
                break
        raise BenchError(f"a batch could not be submitted in {SUBMIT_GIVE_UP_S:.0f} s")


# --- the run -----------------------------------------------------------------------------


@dataclass
class Kill:
    """One SIGKILL and what it cost, measured afterwards from the transition log.

    ``held``: the leases the kill cut off: those of the affected workers (the killed
    daemon; for a replica, every live daemon talking to it) that were open at the kill,
    and, for a daemon, any granted to it after its death (an answer to a request it had
    sent just before).

    ``returned``: from the kill until each of ``held`` has left the lease the kill cut
    off (the first logged change of it after that lease: back to pending, failed, or a
    result accepted), for the last of them: a dead daemon's sentinel reports at once;
    otherwise the lease runs out first.

    ``leases back``: from the kill until each of ``held`` is leased again or has a
    result accepted (the first logged change of it into ``running`` or ``succeeded``
    after that lease), for the last of them: the lease has run out, the reaper has put
    it back, it has waited out its retry backoff and a daemon has claimed it (or, after
    a replica kill, its daemon reached the restarted replica before the lease ran out
    and its result was accepted).

    ``work back``: from the kill until the killed process's work flows again: the first
    result accepted from a daemon started in the killed one's place (``--daemon-restart-s``
    after the kill, under a new worker id), or, for a replica, the first result accepted
    from each daemon slot that talks to it, for the last of them (those daemons reach
    the store only through that replica, so this waits for its restart).

    ``recovery``: the larger of the two.
    """

    number: int
    victim: str
    role: str
    slot: int
    generation: int
    at: float  # epoch seconds
    elapsed: float  # seconds since the run started
    workers: list[str]
    slots: list[int]  # the daemon slots whose work it stopped
    held_live: int  # leases the affected workers held just after the kill (as printed)
    held: list[str] = field(default_factory=list)
    up_after: float | None = None  # a replica: from the kill to /healthz answering again
    returned: float | None = None  # until each of ``held`` left the killed lease
    leases_back: float | None = None
    work_back: float | None = None

    @property
    def recovery(self) -> float | None:
        known = [v for v in (self.leases_back, self.work_back) if v is not None]
        return max(known) if known else None


@dataclass
class Chaos:
    cluster: Cluster
    db: Database
    opts: argparse.Namespace
    producer: Producer | None = None
    kills: list[Kill] = field(default_factory=list)
    restarts: list[tuple[float, Proc, Kill | None]] = field(default_factory=list)
    booting: list[tuple[Proc, Kill | None, float]] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    pill_kills: list[Kill] = field(default_factory=list)  # daemons a poison pill took down
    counts: Counter[str] = field(default_factory=Counter)
    started: float = 0.0

    def finished(self) -> int:
        return sum(self.counts[s] for s in FINAL)

    def run(self, producer: Producer) -> float:
        """Submit, kill, restart until every invocation has ended; the wall time (s)."""
        self.producer = producer
        rng = random.Random(self.opts.seed)
        self.started = time.monotonic()
        next_kill = self.started + self.opts.kill_every_s
        next_note = self.started + 10
        deadline = self.started + self.opts.timeout_s
        producer.start()
        while True:
            now = time.monotonic()
            if producer.error is not None:
                raise BenchError(f"submitting failed: {producer.error!r}")
            self._restart_due(now)
            self._check_booting(now)
            self._check_exits()
            self.counts = self.db.counts()
            if producer.done.is_set() and self.finished() >= len(producer.ids) + len(
                producer.pills
            ):
                if not self.restarts and not self.booting:
                    return time.monotonic() - self.started
            elif now >= next_kill:
                if self._kill_allowed():
                    self._kill(self._victim(rng))
                next_kill += self.opts.kill_every_s
            if now >= next_note:
                self._note(now)
                next_note += 10
            if now > deadline:
                raise BenchError(f"not done after {self.opts.timeout_s:.0f} s: {dict(self.counts)}")
            time.sleep(0.25)

    def _kill_allowed(self) -> bool:
        assert self.producer is not None
        left = self.opts.count - self.finished()
        return not (self.producer.done.is_set() and left < self.opts.backlog)

    def _victim(self, rng: random.Random) -> Proc:
        """Two daemons, then a replica, in turn; which one is drawn."""
        if len(self.kills) % 3 == 2:
            choices = [p for p in self.cluster.replicas if p is not None and p.alive()]
        else:
            choices = [p for p in self.cluster.daemons if p is not None and p.alive()]
        if not choices:  # everything of that kind is down already
            choices = [p for p in self.cluster.every if p.alive()]
        return rng.choice(choices)

    def _kill(self, proc: Proc) -> None:
        if proc.role == "daemon":
            workers = [proc.worker_id]
        else:
            workers = [d.worker_id for d in self.cluster.attached(proc.slot)]
        at = time.time()
        proc.popen.send_signal(signal.SIGKILL)
        proc.popen.wait(timeout=STOP_TIMEOUT_S)
        held = self.db.held_by(workers)
        kill = Kill(
            len(self.kills) + 1,
            proc.name,
            proc.role,
            proc.slot,
            proc.generation,
            at,
            time.monotonic() - self.started,
            workers,
            [proc.slot] if proc.role == "daemon" else self.cluster.slots_of(proc.slot),
            len(held),
        )
        self.kills.append(kill)
        delay = self.opts.daemon_restart_s if proc.role == "daemon" else self.opts.replica_restart_s
        self.restarts.append((time.monotonic() + delay, proc, kill))
        print(
            f"  {kill.elapsed:6.1f}s  kill -9 {proc.name} (pid {proc.popen.pid}),"
            f" {len(held)} leases held by {', '.join(workers) or 'no daemon'}",
            flush=True,
        )

    def _pill_took(self, proc: Proc) -> None:
        """A poison pill's SIGKILL took ``proc`` down: what it held (every lease granted to
        it that did not end in its result, see ``_leases_back``) counts as held at a kill."""
        number = len(self.pill_kills) + 1
        at, elapsed = time.time(), time.monotonic() - self.started
        pill = Kill(number, proc.name, "pill", proc.slot, proc.generation, at, elapsed,
                    [proc.worker_id], [], 0)  # fmt: skip
        self.pill_kills.append(pill)
        self.restarts.append((time.monotonic() + self.opts.daemon_restart_s, proc, None))
        print(f"  {elapsed:6.1f}s  a poison pill took down {proc.name}", flush=True)

    def _restart_due(self, now: float) -> None:
        for entry in list(self.restarts):
            due, proc, kill = entry
            if now < due:
                continue
            self.restarts.remove(entry)
            self._start_again(proc, kill)

    def _start_again(self, proc: Proc, kill: Kill | None) -> None:
        if proc.role == "daemon":
            self.cluster.start_daemon(proc.slot)
        else:  # its health is watched from the loop: the schedule goes on meanwhile
            new = self.cluster.start_replica(proc.slot, wait=False)
            self.booting.append((new, kill, time.monotonic()))

    def _check_booting(self, now: float) -> None:
        for entry in list(self.booting):
            proc, kill, since = entry
            if not proc.alive():  # _check_exits notes it and starts it again
                self.booting.remove(entry)
            elif self.cluster.healthy(proc):
                self.booting.remove(entry)
                if kill is not None:
                    kill.up_after = time.time() - kill.at
            elif now - since > STARTUP_TIMEOUT_S:
                raise BenchError(f"{proc.name} not healthy in {STARTUP_TIMEOUT_S:.0f} s")

    def _check_exits(self) -> None:
        """A process that ended without being killed is a finding: note it, start it again."""
        waiting = {id(proc) for _, proc, _ in self.restarts}
        waiting |= {id(proc) for proc, _, _ in self.booting if proc.alive()}
        for proc in [*self.cluster.replicas, *self.cluster.daemons]:
            if proc is None or proc.alive() or id(proc) in waiting:
                continue
            if self.opts.poison_pills and proc.role == "daemon" and proc.popen.returncode == -9:
                self._pill_took(proc)  # started again as after a kill
                continue
            note = f"{proc.name} exited {proc.popen.returncode} by itself; see {proc.log}"
            print(f"  ! {note}", flush=True)
            self.unexpected.append(note)
            self._start_again(proc, None)

    def _note(self, now: float) -> None:
        assert self.producer is not None
        c = self.counts
        print(
            f"  {now - self.started:6.1f}s  submitted {len(self.producer.ids):,}"
            f"  succeeded {c['succeeded']:,}  running {c['running']}  pending {c['pending']}"
            f"  kills {len(self.kills)}",
            flush=True,
        )


def read_back(url: str, token: str) -> dict[str, dict[str, Any]]:
    """Every invocation of the queue, over the HTTP API (pages of 1,000)."""
    found: dict[str, dict[str, Any]] = {}
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
        cursor = None
        while True:
            params: dict[str, Any] = {"limit": 1000}
            if cursor:
                params["cursor"] = cursor
            response = http.get(f"{NS}/queues/{QUEUE}/invocations", params=params)
            if response.status_code != 200:
                raise BenchError(f"reading back: {response.status_code} {response.text[:300]}")
            page = response.json()
            found.update((i["id"], i) for i in page["invocations"])
            cursor = page["next_cursor"]
            if not cursor:
                return found


# --- what happened -----------------------------------------------------------------------


@dataclass
class Runs:
    """The ledger: each run's start and end, per invocation number."""

    starts: Counter[int] = field(default_factory=Counter)
    ends: Counter[int] = field(default_factory=Counter)
    pills: Counter[int] = field(default_factory=Counter)  # runs of the pill before n

    @classmethod
    def read(cls, path: Path) -> Runs:
        runs = cls()
        text = path.read_text() if path.exists() else ""
        for line in text.splitlines():
            kind, n, _pid, _ppid, _at = line.split()
            if kind == "start":
                runs.starts[int(n)] += 1
            elif kind == "pill":
                runs.pills[int(n)] += 1
            else:
                runs.ends[int(n)] += 1
        return runs


@dataclass
class Findings:
    submitted: int
    rows: int
    succeeded: int
    lost: list[int]
    lost_states: Counter[str]
    completed_twice: list[str]
    left_final: list[str]
    ran_twice: list[int]
    ran_twice_at_kill: int
    ran_twice_elsewhere: list[int]
    finished_twice: int
    without_lease: int
    succeeded_unrun: int
    accepted: int
    leases: int
    overcharged: int  # attempts counted beyond the runs begun, summed
    overcharged_ids: list[int]
    pills: int
    pills_spent: int  # ended failed with every attempt spent
    pill_runs: int


def judge(
    ids: dict[int, str],
    records: dict[str, dict[str, Any]],
    log: list[Transition],
    runs: Runs,
    kills: list[Kill],
    pills: dict[int, str],
    pill_attempts: int,
) -> Findings:
    accepted = Counter(t.invocation for t in log if t.new == "succeeded")
    leased = Counter(t.invocation for t in log if t.new == "running")
    left_final = sorted({t.invocation for t in log if t.old in FINAL})
    lost, lost_states = [], Counter[str]()
    for n, iid in ids.items():
        record = records.get(iid)
        if record is None or record["state"] != "succeeded" or record["result"] != n:
            lost.append(n)
            lost_states["missing" if record is None else str(record["state"])] += 1
    held_at_kill = {iid for kill in kills for iid in kill.held}
    ran_twice = sorted(n for n, c in runs.starts.items() if c > 1)
    at_kill = [n for n in ran_twice if ids.get(n) in held_at_kill]
    beyond = {
        n: records[iid]["attempts"] - runs.starts[n]
        for n, iid in ids.items()
        if iid in records and records[iid]["attempts"] > runs.starts[n]
    }
    spent = [
        iid
        for iid in pills.values()
        if (r := records.get(iid)) and (r["state"], r["attempts"]) == ("failed", pill_attempts)
    ]
    return Findings(
        submitted=len(ids),
        rows=len(records),
        succeeded=len(ids) - len(lost),
        lost=lost,
        lost_states=lost_states,
        completed_twice=sorted(iid for iid, c in accepted.items() if c > 1),
        left_final=left_final,
        ran_twice=ran_twice,
        ran_twice_at_kill=len(at_kill),
        ran_twice_elsewhere=sorted(set(ran_twice) - set(at_kill)),
        finished_twice=sum(1 for c in runs.ends.values() if c > 1),
        without_lease=sum(max(0, runs.starts[n] - leased[iid]) for n, iid in ids.items()),
        succeeded_unrun=sum(1 for n in ids if runs.starts[n] == 0 and n not in lost),
        accepted=sum(accepted.values()),
        leases=sum(leased.values()),
        overcharged=sum(beyond.values()),
        overcharged_ids=sorted(beyond),
        pills=len(pills),
        pills_spent=len(spent),
        pill_runs=sum(runs.pills.values()),
    )


def _worker_slot(worker: str | None) -> tuple[int, int] | None:
    """(slot, generation) of a worker id the bench gave: ``chaos-d{slot + 1}-{generation}``."""
    if not worker or not worker.startswith("chaos-d"):
        return None
    slot, _, generation = worker.removeprefix("chaos-d").partition("-")
    return int(slot) - 1, int(generation)


Grants = dict[str, list[tuple[str, int]]]  # worker -> (invocation, index of the grant)


def measure_recovery(kills: list[Kill], log: list[Transition]) -> None:
    """Fill in each kill's held leases, leases back and work back (see ``Kill``)."""
    by_invocation: defaultdict[str, list[Transition]] = defaultdict(list)
    grants: Grants = defaultdict(list)
    successes: defaultdict[int, list[tuple[int, float]]] = defaultdict(list)  # slot -> (gen, at)
    for t in log:
        changes = by_invocation[t.invocation]
        if t.new == "running" and t.worker:
            grants[t.worker].append((t.invocation, len(changes)))
        if t.new == "succeeded" and (known := _worker_slot(t.worker)) is not None:
            successes[known[0]].append((known[1], t.at))
        changes.append(t)
    for kill in kills:
        _leases_back(kill, by_invocation, grants)
        if kill.role == "daemon":  # its replacements: the same slot, a later generation
            later = [at for g, at in successes[kill.slot] if g > kill.generation]
            firsts = [min((at for at in later if at > kill.at), default=None)]
        else:
            firsts = [
                min((at for _, at in successes[slot] if at > kill.at), default=None)
                for slot in kill.slots
            ]
        if firsts and None not in firsts:
            kill.work_back = max(f for f in firsts if f is not None) - kill.at


def _leases_back(kill: Kill, by_invocation: dict[str, list[Transition]], grants: Grants) -> None:
    backs: list[float | None] = []
    left: list[float | None] = []
    for worker in kill.workers:
        for invocation, index in grants.get(worker, []):
            changes = by_invocation[invocation]
            granted, after = changes[index], changes[index + 1 :]
            if kill.role == "pill":  # the moment it died is not known here: no timing
                if not after or after[0].new != "succeeded":
                    kill.held.append(invocation)
                continue
            open_at_kill = granted.at <= kill.at and (not after or after[0].at > kill.at)
            if open_at_kill or (kill.role == "daemon" and granted.at > kill.at):
                kill.held.append(invocation)
                back = (c.at for c in after if c.new in ("running", "succeeded"))
                backs.append(next(back, None))
                left.append(after[0].at if after else None)
    if backs and None not in backs:
        kill.leases_back = max(b for b in backs if b is not None) - kill.at
    if left and None not in left:
        kill.returned = max(b for b in left if b is not None) - kill.at


# --- output ------------------------------------------------------------------------------


def _s(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def _spread(kills: list[Kill], measure: str = "recovery") -> str:
    known = [v for k in kills if (v := getattr(k, measure)) is not None]
    if not known:
        return "—"
    return f"{statistics.median(known):.1f} / {max(known):.1f}"


def print_kills(kills: list[Kill]) -> None:
    print(
        "| # | at (s) | killed | leases held | returned (s) | leases back (s) | work back (s)"
        " | recovery (s) |"
    )
    print(
        "|--:|-------:|--------|------------:|-------------:|----------------:|--------------:"
        "|-------------:|"
    )
    for k in kills:
        victim = k.victim if k.up_after is None else f"{k.victim} (up at {k.up_after:.1f} s)"
        print(
            f"| {k.number} | {k.elapsed:.1f} | {victim} | {len(k.held)} | {_s(k.returned)}"
            f" | {_s(k.leases_back)}"
            f" | {_s(k.work_back)} | {_s(k.recovery)} |"
        )


def refused_results(logs: list[Path]) -> int:
    """Results a daemon delivered and the store refused because the worker no longer
    held the invocation (its lease had run out): from the daemons' logs."""
    text = "".join(_tail(log, 1 << 30) for log in logs)
    return text.count("refused: this worker does not hold")


def print_summary(
    f: Findings,
    kills: list[Kill],
    wall_s: float,
    retries: int,
    refused: int,
    unexpected: list[str],
    pill_deaths: int,
) -> None:
    daemon_kills = [k for k in kills if k.role == "daemon"]
    replica_kills = [k for k in kills if k.role == "replica"]
    returned = _spread(daemon_kills, "returned")
    rows = [
        ("submitted", f"{f.submitted:,}"),
        ("succeeded", f"{f.succeeded:,}"),
        ("lost", f"{len(f.lost):,}"),
        ("completed twice (results accepted twice by the store)", f"{len(f.completed_twice):,}"),
        ("ran twice (the UDF body started twice)", f"{len(f.ran_twice):,}"),
        ("  of which held at a kill (or by a daemon a pill took down)", f"{f.ran_twice_at_kill:,}"),
        ("  of which not held at any kill", f"{len(f.ran_twice_elsewhere):,}"),
        ("ran twice to the end", f"{f.finished_twice:,}"),
        ("runs beyond the invocation's leases", f"{f.without_lease:,}"),
        ("attempts charged beyond the runs begun", f"{f.overcharged:,}"),
        ("poison pills failed, attempts spent / submitted", f"{f.pills_spent} / {f.pills}"),
        ("  their runs / daemons they took down", f"{f.pill_runs} / {pill_deaths}"),
        ("succeeded with no run in the ledger", f"{f.succeeded_unrun:,}"),
        ("results accepted / leases granted", f"{f.accepted:,} / {f.leases:,}"),
        ("results refused as not held (daemon logs)", f"{refused:,}"),
        ("changes to an ended invocation", f"{len(f.left_final):,}"),
        ("rows in the store", f"{f.rows:,}"),
        ("kills: daemons / replicas", f"{len(daemon_kills)} / {len(replica_kills)}"),
        ("leases returned after a daemon kill, median / max (s)", returned),
        ("recovery after a daemon kill, median / max (s)", _spread(daemon_kills)),
        ("recovery after a replica kill, median / max (s)", _spread(replica_kills)),
        ("processes that exited by themselves", f"{len(unexpected)}"),
        ("submit retries (a replica away)", f"{retries:,}"),
        ("wall time (s)", f"{wall_s:.0f}"),
        ("throughput (succeeded/s)", f"{f.succeeded / wall_s:.1f}"),
    ]
    width = max(len(r) for r, _ in rows)
    print(f"| {'measure':<{width}} | {'value':>11} |")
    print(f"|{'-' * (width + 2)}|{'-' * 12}:|")
    for name, value in rows:
        print(f"| {name:<{width}} | {value:>11} |")
    if f.lost:
        print(f"lost: {dict(f.lost_states)}; numbers {f.lost[:20]}")
    if f.completed_twice or f.left_final:
        print(f"completed twice: {f.completed_twice[:20]}; final left: {f.left_final[:20]}")
    if f.ran_twice_elsewhere:
        print(f"ran twice, held at no kill: numbers {f.ran_twice_elsewhere[:20]}")
    if f.overcharged_ids:
        print(f"attempts charged beyond the runs: numbers {f.overcharged_ids[:20]}")
    for note in unexpected:
        print(f"exited by itself: {note}")


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def describe(opts: argparse.Namespace) -> str:
    try:
        commit = _git("rev-parse", "--short", "HEAD")
        dirty = _git("status", "--porcelain", "--", "src")
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = "unknown", ""
    model = "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        model = next(
            (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), model
        )
    return (
        f"commit: {commit}{' (src/ has uncommitted changes)' if dirty else ''}\n"
        f"nproc: {os.cpu_count()}; cpu: {model}; python {platform.python_version()}\n"
        f"count {opts.count}, daemons {opts.daemons} x capacity {CAPACITY}, replicas"
        f" {opts.replicas}, kill every {opts.kill_every_s:g} s, seed {opts.seed},"
        f" lease {opts.lease_s:g} s, work 0-{2 * opts.work_s:g} s, max_attempts"
        f" {opts.max_attempts}, restarts after {opts.daemon_restart_s:g} s (daemon) /"
        f" {opts.replica_restart_s:g} s (replica), prefetch {opts.prefetch}, poison pills"
        f" {opts.poison_pills} x {opts.pill_attempts} attempts"
    )


# --- main --------------------------------------------------------------------------------


def chaos(opts: argparse.Namespace, workdir: Path) -> int:
    token = secrets.token_urlsafe(24)
    ledger = workdir / "ledger.txt"
    with scratch_database(opts.database_url) as db_url:
        cluster = Cluster(workdir, db_url, token, opts)
        db: Database | None = None
        clean = False
        try:
            cluster.start_replica(0)  # migrates the schema
            db = Database(db_url)
            db.install_transition_log()
            for slot in range(1, opts.replicas):
                cluster.start_replica(slot)
            for slot in range(opts.daemons):
                cluster.start_daemon(slot)
            run = Chaos(cluster, db, opts)
            producer = Producer(
                [cluster.url(s) for s in range(opts.replicas)],
                token,
                ledger,
                opts,
                lambda submitted: submitted - run.finished(),
            )
            try:
                wall_s = run.run(producer)
            finally:
                producer.halt.set()
                producer.join(timeout=30)
            records = read_back(cluster.url(0), token)
            log = db.transitions()
            clean = True
        finally:
            with shielded():
                cluster.stop_all(graceful=clean)
                if db is not None:
                    db.close()
    measure_recovery([*run.kills, *run.pill_kills], log)
    runs = Runs.read(ledger)
    every_kill = [*run.kills, *run.pill_kills]
    findings = judge(
        producer.ids, records, log, runs, every_kill, producer.pills, opts.pill_attempts
    )
    print()
    print_kills(run.kills)
    print()
    logs = sorted({p.log for p in cluster.every if p.role == "daemon"})
    refused = refused_results(logs)
    print_summary(
        findings, run.kills, wall_s, producer.retries, refused, run.unexpected, len(run.pill_kills)
    )
    failed = findings.lost or findings.completed_twice or findings.pills_spent < findings.pills
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=10_000, help="invocations to submit")
    parser.add_argument("--daemons", type=int, default=3, help="daemons (capacity 4 each)")
    parser.add_argument("--replicas", type=int, default=2, help="server replicas")
    parser.add_argument("--kill-every-s", type=float, default=15.0, help="seconds between kills")
    parser.add_argument("--seed", type=int, default=1, help="draws the victims and work times")
    parser.add_argument(
        "--database-url", default=PG_SERVER, help="PostgreSQL to make the scratch database on"
    )
    parser.add_argument("--lease-s", type=float, default=5.0, help="LAKESHORE_LEASE_S")
    parser.add_argument("--work-s", type=float, default=0.1, help="mean run time of the UDF")
    parser.add_argument("--backlog", type=int, default=600, help="unfinished to keep queued")
    parser.add_argument("--max-attempts", type=int, default=10, help="of each invocation")
    parser.add_argument("--daemon-restart-s", type=float, default=1.0)
    parser.add_argument("--replica-restart-s", type=float, default=3.0)
    parser.add_argument("--timeout-s", type=float, default=3600.0, help="give up after")
    parser.add_argument("--keep", action="store_true", help="keep the logs and the ledger")
    parser.add_argument("--prefetch", type=int, default=0, help="each daemon's --prefetch")
    parser.add_argument(
        "--poison-pills", type=int, default=0, help="invocations that kill their daemon"
    )
    parser.add_argument("--pill-attempts", type=int, default=3, help="max_attempts of a pill")
    opts = parser.parse_args()
    if opts.count < 1 or opts.daemons < 1 or not 1 <= opts.replicas <= len(LETTERS):
        parser.error("--count and --daemons must be at least 1, --replicas 1 to 26")
    if opts.prefetch < 0 or opts.poison_pills < 0 or opts.pill_attempts < 1:
        parser.error("--prefetch and --poison-pills are 0 or more, --pill-attempts 1 or more")

    def interrupted(signum: int, _frame: Any) -> None:
        raise Interrupted(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started with it ignored
    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGHUP, interrupted)
    print(describe(opts), flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="lakeshore-chaos-"))
    code = 2
    try:
        code = chaos(opts, workdir)
    except BenchError as exc:
        print(f"chaos: {exc}", file=sys.stderr)
    except (KeyboardInterrupt, Interrupted):
        print("chaos: interrupted; everything it started is stopped", file=sys.stderr)
        code = 130
    finally:
        if code == 0 and not opts.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"logs and ledger: {workdir}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
