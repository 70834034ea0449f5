"""A ``moto_server`` (EC2's API, emulated) on a free local port, for the tests that
launch EC2 instances: the ``ec2`` provider's and the launched machine's install."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

REGION = "us-east-1"
AMI = "ami-12c6146b"  # one of moto's default AMIs


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def moto_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A ``moto_server`` of the test module's own, on a free local port."""
    executable = Path(sys.executable).parent / "moto_server"
    port = free_port()
    log_path = tmp_path_factory.mktemp("moto") / "moto.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [str(executable), "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                pytest.fail(f"moto_server exited: {log_path.read_text()[-2000:]}")
            try:
                httpx.get(f"{url}/moto-api/", timeout=1).raise_for_status()
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    pytest.fail(f"moto_server did not answer: {log_path.read_text()[-2000:]}")
                time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
