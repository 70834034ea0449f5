"""``lakeshore submit QUEUE FN --from-file calls.jsonl`` against a real server, on SQLite
and PostgreSQL: 2,500 calls go in three batches, in order, with each line's own fields;
a file with a bad line is refused with the line's number and stores nothing."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest

from tests.acceptance.conftest import Cli

pytestmark = pytest.mark.acceptance


def _stats(cli: Cli, queue: str) -> dict[str, int]:
    stats = cli.run("queues", "stats", queue, "--json").json()
    return {"pending": stats["pending"], "scheduled": stats["scheduled"]}


def test_a_file_of_calls_goes_in_batches_with_each_lines_fields(cli: Cli, tmp_path: Path) -> None:
    queue = f"bulk-{secrets.token_hex(3)}"
    calls = [{"args": [n], "key": f"call-{n}"} for n in range(2_499)]
    calls.append({"args": [2**64 + 1], "delay_s": 3600, "kwargs": {"tag": "last"}})
    path = tmp_path / "calls.jsonl"
    path.write_text("\n".join(json.dumps(c) for c in calls) + "\n\n")

    done = cli.run(
        "submit", queue, "json:dumps", "--from-file", str(path), "--max-attempts", "2", "--json"
    ).json()

    assert done["submitted"] == 2_500 and len(set(done["ids"])) == 2_500
    assert _stats(cli, queue) == {"pending": 2_499, "scheduled": 1}
    first = cli.run("invocations", "show", done["ids"][0], "--json").json()
    assert (first["args"], first["key"], first["max_attempts"]) == ([0], "call-0", 2)
    last = cli.run("invocations", "show", done["ids"][-1], "--json").json()
    assert (last["args"], last["kwargs"]) == ([2**64 + 1], {"tag": "last"})
    again = cli.run("submit", queue, "json:dumps", "--from-file", str(path), "--json").json()
    assert again["ids"][:2_499] == done["ids"][:2_499]  # the keys: each call once


def test_a_bad_line_is_named_and_nothing_is_submitted(cli: Cli, tmp_path: Path) -> None:
    queue = f"bulk-{secrets.token_hex(3)}"
    assert cli.run("queues", "create", queue).returncode == 0
    path = tmp_path / "calls.jsonl"
    path.write_text('{"args": [1]}\n{"args": [2]}\n{"args": {"no": 3}}\n{"fn": "x:y"}\n')

    refused = cli.run("submit", queue, "json:dumps", "--from-file", str(path))

    assert refused.returncode != 0
    assert "2 bad line(s), nothing submitted" in refused.message
    assert "line 3: args must be a list" in refused.message
    assert "line 4: unknown field 'fn'" in refused.message
    assert _stats(cli, queue) == {"pending": 0, "scheduled": 0}
