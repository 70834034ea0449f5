"""Where a request goes and which certificates it trusts: one policy for every client.

The SDK, the async client, the CLI and the daemon (its claims, reports, streams and its
sentinel's last word) all reach the server through :mod:`lakeshore.transport`, and all
of them read the environment here, once, the same way:

- **Proxies**: ``HTTPS_PROXY`` / ``HTTP_PROXY`` / ``ALL_PROXY`` name the proxy for a
  server's scheme, ``NO_PROXY`` the hosts reached directly (the standard library's reading,
  the one ``curl`` and ``requests`` share). An HTTP(S) proxy is used (a SOCKS proxy is
  not). A request through a proxy goes over the httpx-backed implementation; every
  other over the direct one.
- **Certificates**: ``LAKESHORE_CA_BUNDLE`` (a file or a directory of PEM certificates)
  when set; else ``SSL_CERT_FILE`` or ``SSL_CERT_DIR``; else the ``certifi`` bundle. No
  client trusts the OS store by one path and certifi by another.
- Nothing else: no ``.netrc`` (the token is a request's only credential).
"""

from __future__ import annotations

import os
import ssl
import urllib.request
from urllib.parse import urlsplit

CA_ENV = "LAKESHORE_CA_BUNDLE"


def proxy_for(url: str) -> str | None:
    """The HTTP(S) proxy the environment names for ``url``, or ``None`` to go direct."""
    parts = urlsplit(url)
    if urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    found = urllib.request.getproxies()
    proxy = found.get(parts.scheme) or found.get("all")
    return proxy if proxy and urlsplit(proxy).scheme in ("http", "https") else None


def tls_context(url: str, *, ca: str | None = None) -> ssl.SSLContext:
    """The TLS context for requests to ``url``: the certificates of ``ca`` (a file or a
    directory), else of ``LAKESHORE_CA_BUNDLE``, else httpx's reading (``SSL_CERT_FILE``,
    ``SSL_CERT_DIR``, else certifi). When neither the server nor its proxy speaks TLS, no
    certificate is loaded (~20 ms of CPU at every start): the context then trusts none,
    so a TLS connection it was not meant for is refused, never made unverified."""
    ca = ca or os.environ.get(CA_ENV) or None
    if ca:
        if os.path.isdir(ca):
            return ssl.create_default_context(capath=ca)
        return ssl.create_default_context(cafile=ca)
    proxy = proxy_for(url)
    if urlsplit(url).scheme == "https" or (proxy and urlsplit(proxy).scheme == "https"):
        import httpx  # its certificate reading, as the httpx-backed requests make it

        return httpx.create_ssl_context()
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies, and trusts nothing
