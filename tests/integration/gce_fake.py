"""A small HTTP fake of Compute Engine's ``compute/v1`` instances routes, for the gce tests.

No GCE emulator exists, so the tests serve this one on 127.0.0.1 and point the real
``google-cloud-compute`` client at it (``api_endpoint`` + anonymous credentials). It
answers the routes and shapes the installed client's REST transport uses
(``google/cloud/compute_v1/services/instances/transports/rest_base.py``):

- ``POST   /compute/v1/projects/{p}/zones/{z}/instances``: store the instance (409 when
  the name is taken) and answer a zone ``Operation``;
- ``GET    /compute/v1/projects/{p}/zones/{z}/instances[/{name}]``: list / get;
- ``DELETE /compute/v1/projects/{p}/zones/{z}/instances/{name}``: an ``Operation``, 404
  (Google's error JSON) when missing.

The provider never polls an operation (see ``lakeshore.providers.gce``), so there is no
``operations`` route: a request for one answers 404 like any unknown path.

``fail_with(status, body)`` makes every later request answer that instead (a 500, or a
200 with garbage); ``requests`` records what was asked, headers included.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

ZONE_PATH = re.compile(
    r"^/compute/v1/projects/(?P<project>[^/]+)/zones/(?P<zone>[^/]+)"
    r"/instances(?:/(?P<name>[^/]+))?$"
)


@dataclass
class Seen:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: Any


@dataclass
class GceFake:
    """The fake's state; the server thread reads and writes it under ``lock``."""

    url: str = ""
    instances: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    requests: list[Seen] = field(default_factory=list)
    failure: tuple[int, bytes] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1000))

    def reset(self) -> None:
        with self.lock:
            self.instances.clear()
            self.requests.clear()
            self.failure = None

    def fail_with(self, status: int, body: bytes | dict[str, Any]) -> None:
        raw = json.dumps(body).encode() if isinstance(body, dict) else body
        with self.lock:
            self.failure = (status, raw)

    def instance(
        self, name: str, project: str = "proj", zone: str = "us-central1-a"
    ) -> dict[str, Any]:
        with self.lock:
            return self.instances[(project, zone, name)]

    def names(self) -> list[str]:
        with self.lock:
            return sorted(name for _, _, name in self.instances)

    # --- answers: (status, JSON body) -----------------------------------------------

    def handle(
        self, method: str, *, project: str, zone: str, name: str | None, body: Any
    ) -> tuple[int, Any]:
        with self.lock:
            if self.failure is not None:
                return self.failure
            if name is None and method == "POST":
                return self._insert(project, zone, body)
            if name is None:
                here = [
                    v
                    for (p, z, _), v in sorted(self.instances.items())
                    if (p, z) == (project, zone)
                ]
                return 200, {"kind": "compute#instanceList", "items": here}
            found = self.instances.get((project, zone, name))
            if found is None:
                resource = f"projects/{project}/zones/{zone}/instances/{name}"
                return 404, _error(404, f"The resource '{resource}' was not found", "notFound")
            if method == "DELETE":
                del self.instances[(project, zone, name)]
                return 200, self._operation(project, zone, "delete", name)
            return 200, found

    def _insert(self, project: str, zone: str, body: Any) -> tuple[int, Any]:
        if not isinstance(body, dict) or not body.get("name"):
            return 400, _error(400, "Invalid value for field 'resource.name'", "invalid")
        key = (project, zone, body["name"])
        if key in self.instances:
            return 409, _error(
                409, f"The resource '{body['name']}' already exists", "alreadyExists"
            )
        self.instances[key] = {**body, "id": str(next(self._ids)), "status": "PROVISIONING"}
        return 200, self._operation(project, zone, "insert", body["name"])

    def _operation(self, project: str, zone: str, kind: str, target: str) -> dict[str, Any]:
        name = f"operation-{next(self._ids)}"
        base = f"{self.url}/compute/v1/projects/{project}/zones/{zone}"
        return {
            "kind": "compute#operation",
            "id": str(next(self._ids)),
            "name": name,
            "zone": base,
            "operationType": kind,
            "targetLink": f"{base}/instances/{target}",
            "status": "RUNNING",
            "progress": 0,
            "selfLink": f"{base}/operations/{name}",
        }


def _error(code: int, message: str, reason: str) -> dict[str, Any]:
    return {
        "error": {
            "code": code,
            "message": message,
            "errors": [{"message": message, "domain": "global", "reason": reason}],
        }
    }


def _handler(fake: GceFake) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            url = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode(errors="replace")
            with fake.lock:
                fake.requests.append(
                    Seen(self.command, url.path, url.query, dict(self.headers.items()), body)
                )
            match = ZONE_PATH.match(url.path)
            if match is None:
                status, answer = 404, _error(404, f"no route {url.path}", "notFound")
            else:
                status, answer = fake.handle(self.command, body=body, **match.groupdict())
            data = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=UTF-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = _serve

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

    return Handler


@contextmanager
def serve() -> Iterator[GceFake]:
    """The fake on a free port of 127.0.0.1, in a thread, for the ``with`` block."""
    fake = GceFake()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
