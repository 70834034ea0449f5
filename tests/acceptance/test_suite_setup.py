"""The suite's own contract with CI: PostgreSQL is not optional there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_store_test(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--basetemp={tmp_path / 'inner'}",
            "tests/integration/test_store.py",
            "-k",
            "migrating_twice",
        ],
        cwd=ROOT,
        env={
            **os.environ,
            "LAKESHORE_TEST_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/none",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.acceptance
def test_unreachable_postgresql_fails_the_run_under_ci(tmp_path: Path) -> None:
    result = run_store_test(tmp_path, CI="true")
    assert result.returncode != 0
    assert "unreachable under CI=true" in result.stdout


@pytest.mark.acceptance
def test_unreachable_postgresql_skips_outside_ci(tmp_path: Path) -> None:
    result = run_store_test(tmp_path, CI="false")
    assert result.returncode == 0, result.stdout
    assert "1 passed, 1 skipped" in result.stdout
