"""A function whose module imports a heavy library (the preload benchmark runs it)."""

from __future__ import annotations

import kubernetes.client  # a few hundred ms to import, like many ML and cloud libraries


def api_version() -> str:
    return str(kubernetes.client.ApiClient.__module__)
