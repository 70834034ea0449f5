"""What a launched daemon is told: its arguments, its environment, a fresh machine's script."""

from __future__ import annotations

import subprocess
from pathlib import Path

from lakeshore.domain.fleet import LaunchBody
from lakeshore.providers.base import LaunchRequest

BODY = LaunchBody(
    queues=("gpu", "cpu"),
    runners=("process",),
    capacity=4,
    cloud_tags={"gpu": "a100", "team": "ml"},
    bootstrap_script="echo boot >> steps",
    setup_commands=("echo setup-1 >> steps", "echo 'it''s quoted' >> steps"),
)
REQUEST = LaunchRequest("lch_1", "team-a", "pool:p", "http://10.0.0.1:8270", "lks_x_y", BODY)


def test_daemon_args_carry_the_launch() -> None:
    assert REQUEST.daemon_args() == [
        "daemon", "run", "--launch-id", "lch_1", "--capacity", "4",
        "--queue", "gpu", "--queue", "cpu", "--runner", "process",
        "--tag", "gpu:a100", "--tag", "team:ml",
    ]  # fmt: skip
    assert REQUEST.daemon_env() == {
        "LAKESHORE_URL": "http://10.0.0.1:8270",
        "LAKESHORE_NAMESPACE": "team-a",
        "LAKESHORE_TOKEN": "lks_x_y",
    }


def test_the_startup_script_runs_its_steps_in_order_then_powers_off(tmp_path: Path) -> None:
    """Run the script with stand-ins for python3 (the daemon) and shutdown: every step in order, the
    daemon with its environment, and the power-off once it exits, even if it failed."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(
        '#!/bin/bash\necho "daemon $LAKESHORE_URL $LAKESHORE_TOKEN $*" >> steps\nexit 3\n'
    )
    (bin_dir / "shutdown").write_text('#!/bin/bash\necho "shutdown $*" >> steps\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    script = REQUEST.startup_script("echo install >> steps")
    done = subprocess.run(
        ["bash", "-c", script],
        cwd=tmp_path,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    steps = (tmp_path / "steps").read_text().splitlines()
    assert steps[:4] == ["boot", "setup-1", "its quoted", "install"]
    assert steps[4].startswith(
        "daemon http://10.0.0.1:8270 lks_x_y -m lakeshore daemon run --launch-id lch_1"
    )
    assert steps[5] == "shutdown -h now"


def test_a_failing_setup_step_stops_the_script(tmp_path: Path) -> None:
    body = LaunchBody(queues=("q",), setup_commands=("exit 7", "echo never >> steps"))
    request = LaunchRequest("lch_2", "default", "q", "http://s", None, body)
    done = subprocess.run(
        ["bash", "-c", request.startup_script("echo install >> steps")],
        cwd=tmp_path,
        capture_output=True,
        timeout=30,
    )
    assert done.returncode == 7
    assert not (tmp_path / "steps").exists()
