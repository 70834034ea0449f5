"""A pool child reading several messages in one read (lakeshore.daemon.child), over its
real socket: what came with the first async invocation is taken up with it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from typing import Any

from lakeshore.daemon import wire


def test_async_invocations_sent_in_one_write_all_run_together() -> None:
    ours, theirs = socket.socketpair()
    child = subprocess.Popen(
        [sys.executable, "-m", "lakeshore.daemon.child", str(os.getpid()), str(theirs.fileno())],
        pass_fds=(theirs.fileno(),),
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    theirs.close()
    frames = wire.Frames()
    done: dict[str, Any] = {}
    try:
        init = {"path": list(sys.path), "preload": [], "rss": False}
        # the init and three runs of a function that returns only once all three run at
        # once in this child: one write, so the child reads them in one go
        runs = [
            ("run", str(n), "tests.udfs_pool:together", ["one-read", 3], {}, 5.0) for n in range(3)
        ]
        ours.sendall(wire.pack_all([("init", init), *runs]))
        ours.settimeout(30)
        deadline = time.monotonic() + 30
        while len(done) < 3 and time.monotonic() < deadline:
            data = ours.recv(65536)
            assert data, "the child ended"
            for message in frames.feed(data):
                if message[0] == "done":
                    done[message[1]] = message
    finally:
        ours.close()
        child.kill()
        child.wait(timeout=10)
    assert sorted(done) == ["0", "1", "2"]
    assert [done[n][2] for n in ("0", "1", "2")] == ["ok"] * 3, list(done.values())
    assert len({done[n][3] for n in ("0", "1", "2")}) == 1  # one child's pid, three times
