"""Submit → launch request for a queue at zero: how long the first submit to an idle
``fully_elastic`` queue (no daemon, nothing in flight, nothing pending) waits before the
controller asks its provider for a daemon.

For each backend: a real ``lakeshore server`` with its controller loop on at the default
5 s interval, the ``fake`` provider, and ``--queues`` queues ``fully_elastic`` from zero.
Once a tick has seen them all at zero, each queue in turn gets one submit, and the time
from the submit's request to its launch appearing in the provider's launches (the
launch's own ``created_at``, the moment the controller recorded the request) is taken.
Then the same for ``--queues`` fresh queues, each created and submitted to at once (the
README's first steps: no tick has seen it).

    .venv/bin/python bench/scale_from_zero.py            # both stores, 20 queues each
    .venv/bin/python bench/scale_from_zero.py --backend sqlite --queues 50
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from taskqueue import NS, BenchError, check, machine, pg_database, running_server

INTERVAL_S = "5"  # the controller's default interval
POLL_S = 0.002


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def wait_for(predicate: Any, within_s: float, what: str) -> Any:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(POLL_S)
    raise BenchError(f"no {what} within {within_s:.0f} s")


def _create(http: httpx.Client, name: str) -> None:
    spec = {"name": name, "elasticity": {"kind": "fully_elastic", "min": 0, "max": 2}}
    check(http.post(f"{NS}/queues", json={**spec, "providerRef": "fk"}), 201)


def _submit_and_wait(http: httpx.Client, name: str) -> float:
    """ms from a submit's request to its launch request (the launch's ``created_at``)."""
    sent = datetime.now().astimezone()
    check(http.post(f"{NS}/queues/{name}/invocations", json={"fn": "m:f"}), 201)

    def launched() -> list[dict[str, Any]]:
        found = check(http.get(f"{NS}/providers/fk/launches"), 200)["launches"]
        return [launch for launch in found if launch["scope"] == name]

    launch = wait_for(launched, 30, f"launch for {name}")[0]
    asked = datetime.fromisoformat(launch["created_at"])
    return (asked - sent).total_seconds() * 1000


def measure(url: str, token: str, queues: int) -> tuple[list[float], list[float]]:
    """The waits of queues a tick saw at zero, then of fresh queues."""
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, headers=headers, timeout=30) as http:
        body = {"name": "fk", "kind": "fake", "config": {}}
        check(http.post(f"{NS}/providers", json=body), 201)
        names = [f"cold-{n}" for n in range(queues)]
        for name in names:
            _create(http, name)

        def ticked() -> bool:  # every queue has a decision: a tick saw them at zero
            for name in names:
                events = check(http.get(f"{NS}/queues/{name}/events?verbose=true"), 200)
                if not events["events"]:
                    return False
            return True

        wait_for(ticked, 30, "tick over every queue")
        seen = [_submit_and_wait(http, name) for name in names]
        fresh = []
        for n in range(queues):
            _create(http, f"fresh-{n}")
            fresh.append(_submit_and_wait(http, f"fresh-{n}"))
        return seen, fresh


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--queues", type=int, default=20, help="queues probed, one submit each")
    opts = parser.parse_args()
    print(machine())
    print(
        f"command: python bench/scale_from_zero.py --backend {opts.backend} --queues {opts.queues}"
    )
    print(f"controller interval {INTERVAL_S} s; fake provider")
    backends = ["sqlite", "postgresql"] if opts.backend == "both" else [opts.backend]
    for backend in backends:
        with tempfile.TemporaryDirectory(prefix="lakeshore-bench-") as tmp:
            work = Path(tmp)
            if backend == "sqlite":
                seen, fresh = _run(f"sqlite:///{work / 'lakeshore.db'}", work, opts.queues)
            else:
                with pg_database() as db:
                    seen, fresh = _run(db, work, opts.queues)
        for label, waits in (("seen at zero", seen), ("fresh queue", fresh)):
            print(
                f"{backend:10s} {label:12s} submit → launch request, ms: "
                f"p50 {percentile(waits, 50):.1f}  p95 {percentile(waits, 95):.1f}  "
                f"max {max(waits):.1f}  mean {statistics.fmean(waits):.1f}  (n={len(waits)})"
            )
    return 0


def _run(db: str, work: Path, queues: int) -> tuple[list[float], list[float]]:
    settings = {"ELASTICITY_ENABLED": "true", "ELASTICITY_INTERVAL_S": INTERVAL_S}
    with running_server(db, work, **settings) as (url, token):
        return measure(url, token, queues)


if __name__ == "__main__":
    sys.exit(main())
