"""How long a waiting claim's answer takes to be read by an idle client, by HTTP client.

A daemon's long-poll claim is answered when a submit is handed to it; from the server's
write to the daemon holding the parsed answer is part of every idle worker's
submit→start. Here a server with no framework (asyncio streams on uvloop, in a process
of its own) holds each ``POST /claim`` for ``--idle-ms`` (the client sits idle, as a
waiting daemon does), stamps ``time.time()`` into a claim-shaped JSON answer and writes
it; the client, in another process on asyncio's own loop as the daemon runs, notes when
it has the answer parsed. Clients: httpx (the daemon's), aiohttp when it is installed,
and asyncio streams with the HTTP written out by hand (the floor). One keep-alive
connection each; ``--probes`` answers; p50 and p90 in milliseconds.

Usage (from the repository root)::

    .venv/bin/python bench/claim_read.py [--probes 200] [--idle-ms 30] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import socket
import subprocess
import sys
import time


async def serve(port: int, idle_s: float) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = _length(head)
                if length:
                    await reader.readexactly(length)
                await asyncio.sleep(idle_s)
                invocation = {"id": "inv_x", "fn": "m:f", "args": [], "kwargs": {}}
                body = json.dumps({"invocations": [invocation], "t": time.time()}).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(body), body)
                )
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def _length(head: bytes) -> int:
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


async def read_with(client: str, port: int, probes: int) -> list[float]:
    url, body = f"http://127.0.0.1:{port}/claim", {"timeout_s": 20, "max": 8}
    lags: list[float] = []
    if client == "httpx":
        import httpx

        async with httpx.AsyncClient() as http:
            for _ in range(probes):
                answer = (await http.post(url, json=body)).json()
                lags.append(time.time() - answer["t"])
    elif client == "aiohttp":
        import aiohttp

        async with aiohttp.ClientSession() as session:
            for _ in range(probes):
                async with session.post(url, json=body) as response:
                    answer = await response.json()
                lags.append(time.time() - answer["t"])
    else:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        sent = json.dumps(body).encode()
        request = (
            b"POST /claim HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(sent), sent)
        )
        for _ in range(probes):
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            answer = json.loads(await reader.readexactly(_length(head)))
            lags.append(time.time() - answer["t"])
        writer.close()
    return sorted(lags)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--probes", type=int, default=200)
    parser.add_argument("--idle-ms", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the server process
    parser.add_argument("--client", help=argparse.SUPPRESS)  # a client process, on this port
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.serve:
        import uvloop

        uvloop.run(serve(opts.serve, opts.idle_ms / 1000))
        return 0
    if opts.client:
        lags = asyncio.run(read_with(opts.client, opts.port, opts.probes))
        print(json.dumps([lags[len(lags) // 2] * 1e3, lags[int(len(lags) * 0.9)] * 1e3]))
        return 0
    clients = ["httpx", "aiohttp", "asyncio streams"]
    if importlib.util.find_spec("aiohttp") is None:
        clients.remove("aiohttp")
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(port), "--idle-ms", str(opts.idle_ms)]
    )
    try:
        _wait_for(port)
        print("| round | client | p50 (ms) | p90 (ms) |\n|---:|---|---:|---:|")
        for n in range(1, opts.rounds + 1):
            for client in clients:
                args = ["--client", client, "--port", str(port), "--probes", str(opts.probes)]
                out = subprocess.run(
                    [sys.executable, __file__, *args],
                    capture_output=True,
                    text=True,
                    check=True,
                    timeout=60 + opts.probes * (opts.idle_ms / 1000 + 0.1),
                ).stdout
                p50, p90 = json.loads(out)
                print(f"| {n} | {client} | {p50:.2f} | {p90:.2f} |", flush=True)
    finally:
        server.terminate()
        server.wait(10)
    return 0


def _wait_for(port: int, within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit("the claim server did not start") from None
            time.sleep(0.05)


if __name__ == "__main__":
    sys.exit(main())
