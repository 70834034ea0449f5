"""Running limits with real daemons (issue 39): ``max_running`` 2 with two daemons of
capacity 4 never runs more than 2 at once and does reach 2; ``max_running_per_key`` 1
with two keys never runs one key twice at once. Each invocation records its own start
and end (``tests/udfs_spans.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.acceptance.test_daemons import (
    NS,
    http,
    server,
    start_daemon,
    stop,
    wait_for,
)

__all__ = ["http", "server"]  # the fixtures, shared with the module they come from

SPAN = "tests.udfs_spans:span"
RUN_S = 0.3


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most of ``spans`` (start, end) that overlap at one moment."""
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    most = now = 0
    for _, step in edges:  # an end sorts before a start at the same instant
        now += step
        most = max(most, now)
    return most


def run(
    http: httpx.Client,
    server: Any,
    tmp_path: Path,
    queue: str,
    admission: dict[str, Any],
    keys: list[str | None],
) -> dict[str | None, list[tuple[float, float]]]:
    ledger = tmp_path / f"{queue}.ledger"
    made = http.post(f"{NS}/queues", json={"name": queue, "admission": admission})
    assert made.status_code == 201, made.text
    daemons = [
        start_daemon(server, tmp_path / f"{queue}-{n}.log", "--queue", queue, "--capacity", "4")
        for n in range(2)
    ]
    try:
        items = []
        for n, key in enumerate(keys):
            item: dict[str, Any] = {"fn": SPAN, "args": [str(ledger), f"{key}-{n}", RUN_S]}
            if key is not None:
                item["concurrency_key"] = key
            items.append(item)
        path = f"{NS}/queues/{queue}/invocations/batch"
        assert http.post(path, json={"invocations": items}).status_code == 201

        def done() -> bool:
            return ledger.exists() and len(ledger.read_text().splitlines()) == len(keys)

        wait_for(done, 120, "every invocation to run")
    finally:
        for daemon in daemons:
            stop(daemon)
    spans: dict[str | None, list[tuple[float, float]]] = {}
    for line in ledger.read_text().splitlines():
        tag, began, ended = line.split()
        key = tag.rsplit("-", 1)[0]
        spans.setdefault(None if key == "None" else key, []).append((float(began), float(ended)))
    return spans


def test_max_running_holds_across_two_daemons(
    http: httpx.Client, server: Any, tmp_path: Path
) -> None:
    spans = run(http, server, tmp_path, "capped", {"max_running": 2}, [None] * 12)
    assert most_at_once(spans[None]) == 2


def test_max_running_per_key_runs_no_key_twice_at_once(
    http: httpx.Client, server: Any, tmp_path: Path
) -> None:
    spans = run(http, server, tmp_path, "per-key", {"max_running_per_key": 1}, ["a", "b"] * 5)
    assert most_at_once(spans["a"]) == 1
    assert most_at_once(spans["b"]) == 1
    assert most_at_once(spans["a"] + spans["b"]) == 2  # the two keys did run side by side
