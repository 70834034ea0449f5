"""Wrong tokens are counted against the client address as ``lakeshore server`` sees it:
behind a proxy it trusts (``LAKESHORE_FORWARDED_ALLOW_IPS``), the address the proxy
forwards (``X-Forwarded-For``), so one client's wrong tokens throttle that client only.

The test's own client, on 127.0.0.1, is the trusted hop: it sends ``X-Forwarded-For`` as
a proxy would. The store plays no part in the count: SQLite only.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from lakeshore.services.throttle import BURST
from tests.acceptance.conftest import clean_env, running_server

pytestmark = pytest.mark.acceptance

QUEUES = "/v1/namespaces/default/queues"
WRONG = "Bearer lks_0123456789abcdef_not-a-secret-we-issued"


def test_behind_a_trusted_proxy_each_forwarded_client_is_throttled_on_its_own(
    tmp_path: Path,
) -> None:
    env = clean_env(LAKESHORE_FORWARDED_ALLOW_IPS="127.0.0.1")
    db, data_dir, log = tmp_path / "lakeshore.db", tmp_path / "data", tmp_path / "server.log"
    with (
        running_server("sqlite", str(db), data_dir, log, env) as srv,
        httpx.Client(base_url=srv.url, timeout=10) as hop,
    ):

        def ask(client: str, authorization: str) -> httpx.Response:
            headers = {"Authorization": authorization, "X-Forwarded-For": client}
            return hop.get(QUEUES, headers=headers)

        admin = f"Bearer {srv.admin_token}"
        for _ in range(BURST):
            assert ask("203.0.113.9", WRONG).status_code == 401
        refused = ask("203.0.113.9", WRONG)
        assert refused.status_code == 429, refused.text
        assert int(refused.headers["retry-after"]) >= 1

        # another client behind the same proxy: its own count, its valid token taken
        assert ask("198.51.100.7", admin).status_code == 200
        assert ask("198.51.100.7", WRONG).status_code == 401
        # the hop's own requests are the hop's
        assert hop.get(QUEUES, headers={"Authorization": WRONG}).status_code == 401
    assert "failed tokens or sign-ins from 203.0.113.9" in log.read_text(errors="replace")
