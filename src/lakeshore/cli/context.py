"""Global CLI options (--server, --token, --namespace, -o) and where their defaults come
from; :mod:`lakeshore.cli.global_options` lets them follow the command too."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import quote

import typer

from lakeshore.cli.client import ApiClient
from lakeshore.defaults import read_local_admin_token as local_admin_token


@dataclass
class CliContext:
    server: str
    token: str | None
    namespace: str
    output: str | None = None  # -o given before the command: json, yaml, wide
    _client: ApiClient | None = field(default=None, repr=False)

    @property
    def client(self) -> ApiClient:
        if self._client is None:
            self._client = ApiClient(self.server, self.token or local_admin_token())
        return self._client

    def ns_path(self, *segments: str, namespace: str | None = None) -> str:
        """``/v1/namespaces/{ns}/seg/…`` with every segment escaped, so a name typed by a
        user (``x/../y``, ``q?x=1``) can only ever address itself."""
        parts = [namespace or self.namespace, *segments]
        return "/v1/namespaces/" + "/".join(quote(part, safe="") for part in parts)


def get(ctx: typer.Context) -> CliContext:
    obj = ctx.find_root().obj
    assert isinstance(obj, CliContext)
    return obj
