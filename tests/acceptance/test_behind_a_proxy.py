"""``lakeshore server`` behind a TLS proxy: ``LAKESHORE_FORWARDED_ALLOW_IPS`` names the
peers whose ``X-Forwarded-Proto`` / ``X-Forwarded-For`` it believes.

The proxy here is a small forwarding hop in the test, on 127.0.0.1, that speaks plain
HTTP to the test and adds what a TLS-terminating proxy adds (``X-Forwarded-Proto: https``,
``X-Forwarded-For``, the public ``Host``). Trusted, the dashboard's sign-in works through
it and every cookie it sets is ``Secure``; not trusted, the headers are ignored: the
request is plain HTTP to the server, so the browser's ``https://`` Origin is refused (403)
and no cookie is ``Secure``. The store plays no part in what is trusted: SQLite only.
"""

from __future__ import annotations

import re
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from tests.acceptance.conftest import CLI_TIMEOUT_S, LAKESHORE, clean_env, running_server

pytestmark = pytest.mark.acceptance

PUBLIC_HOST = "lakeshore.example"
BROWSER = "203.0.113.9"  # the address the proxy says the request came from
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "upgrade", "host"}


@contextmanager
def tls_proxy(upstream: str) -> Iterator[str]:
    """A forwarding hop to ``upstream`` as a TLS-terminating proxy would forward: its URL."""
    client = httpx.Client(base_url=upstream, timeout=10, follow_redirects=False)

    class Forward(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            headers = [(k, v) for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP]
            headers += [
                ("Host", PUBLIC_HOST),
                ("X-Forwarded-Proto", "https"),
                ("X-Forwarded-For", BROWSER),
            ]
            answer = client.request(self.command, self.path, headers=headers, content=body)
            self.send_response(answer.status_code)
            for name, value in answer.headers.multi_items():
                if name.lower() not in HOP_BY_HOP and name.lower() != "content-length":
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(answer.content)))
            self.end_headers()
            self.wfile.write(answer.content)

        do_GET = do_POST = _forward

        def log_message(self, format: str, *args: object) -> None:
            pass

    proxy = ThreadingHTTPServer(("127.0.0.1", 0), Forward)
    serving = threading.Thread(target=proxy.serve_forever, name="tls-proxy", daemon=True)
    serving.start()
    try:
        yield f"http://127.0.0.1:{proxy.server_address[1]}"
    finally:
        proxy.shutdown()
        proxy.server_close()
        serving.join(timeout=10)
        client.close()


def set_cookies(answer: httpx.Response) -> list[str]:
    """The cookies ``answer`` sets (its ``Set-Cookie`` lines that delete one left out)."""
    lines = answer.headers.get_list("set-cookie")
    return [line for line in lines if "max-age=0" not in line.lower()]


def cookie_header(answer: httpx.Response) -> str:
    """What a browser sends back: each cookie's ``name=value`` (the jar of an HTTP client
    would hold back ``Secure`` ones from an ``http://`` URL; the browser's is https)."""
    return "; ".join(line.split(";", 1)[0] for line in set_cookies(answer))


def sign_in(proxy: str, token: str) -> tuple[httpx.Response, httpx.Response]:
    """The dashboard's sign-in through the proxy, as a browser on https://PUBLIC_HOST
    does it: the form (its CSRF token and cookie), then the form posted back."""
    with httpx.Client(base_url=proxy, timeout=10, follow_redirects=False) as browser:
        form = browser.get("/ui/login")
        assert form.status_code == 200, form.text
        found = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert found, form.text
        posted = browser.post(
            "/ui/login",
            data={"token": token, "csrf": found.group(1)},
            headers={"Origin": f"https://{PUBLIC_HOST}", "Cookie": cookie_header(form)},
        )
    return form, posted


@contextmanager
def server_trusting(tmp_path: Path, forwarded_allow_ips: str | None) -> Iterator[tuple[str, str]]:
    """A server with the setting given (``None``: its default); (its URL, admin token)."""
    env = clean_env(LAKESHORE_FORWARDED_ALLOW_IPS=forwarded_allow_ips)
    db, data_dir, log = tmp_path / "lakeshore.db", tmp_path / "data", tmp_path / "server.log"
    with running_server("sqlite", str(db), data_dir, log, env) as srv:
        yield srv.url, srv.admin_token


@pytest.mark.parametrize("trusted", ["127.0.0.1", "127.0.0.0/8,10.0.0.0/8"])
def test_behind_a_trusted_tls_proxy_the_sign_in_works_and_its_cookies_are_secure(
    tmp_path: Path, trusted: str
) -> None:
    with server_trusting(tmp_path, trusted) as (url, token), tls_proxy(url) as proxy:
        form, posted = sign_in(proxy, token)
    log = (tmp_path / "server.log").read_text(errors="replace")

    assert posted.status_code == 303, posted.text
    assert posted.headers["location"].startswith("/ui/ns/")
    for answer in (form, posted):
        lines = set_cookies(answer)
        assert lines
        for line in lines:
            assert "; secure" in line.lower(), line
    # the browser's address, not the proxy's, is the request's client
    assert f'{BROWSER}:0 - "POST /ui/login' in log


def test_behind_a_proxy_it_does_not_trust_the_forwarded_headers_are_ignored(
    tmp_path: Path,
) -> None:
    with server_trusting(tmp_path, "10.0.0.0/8") as (url, token), tls_proxy(url) as proxy:
        form, posted = sign_in(proxy, token)
    log = (tmp_path / "server.log").read_text(errors="replace")

    assert posted.status_code == 403, posted.text  # plain http: the https Origin is not its own
    assert all("secure" not in line.lower() for line in set_cookies(form))
    assert "127.0.0.1:" in log and BROWSER not in log  # the proxy is the client


def test_a_host_name_among_the_trusted_addresses_is_refused_at_start(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(LAKESHORE), "server", "--data-dir", str(tmp_path / "d")],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=CLI_TIMEOUT_S,
        env=clean_env(LAKESHORE_FORWARDED_ALLOW_IPS="10.0.0.1,proxy.internal"), check=False,
    )  # fmt: skip

    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        "lakeshore: LAKESHORE_FORWARDED_ALLOW_IPS: expected addresses or networks "
        "(10.0.0.0/8), comma-separated, or *; 'proxy.internal' is neither"
    ]
