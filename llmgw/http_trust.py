"""The certificates llmgw's HTTPS clients trust by default, loaded once per process.

httpx makes an `ssl.SSLContext` for every client created with its default `verify=True` (certifi's CA bundle, or
the files SSL_CERT_FILE / SSL_CERT_DIR name: `httpx.create_ssl_context`), about 20 ms of CPU each on a 2-core
machine, and llmgw makes clients often: an agent's engine-load reading every `telemetry_interval`, each weights
fetch, each admin-API client. `default_verify()` is that same context, made at first use and then shared; pass it as
`verify=`. Shared contexts must not be changed (no `load_cert_chain`, no option changes): a client that needs other
trust or a client certificate makes its own.
"""

from __future__ import annotations

import functools
import os
import ssl


def default_verify() -> ssl.SSLContext:
    """httpx's default `verify=True` context (`httpx.create_ssl_context()`), one per process and per value of
    SSL_CERT_FILE and SSL_CERT_DIR (read at each call, as httpx reads them at each client)."""
    return _context(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))


@functools.cache
def _context(cert_file: str | None, cert_dir: str | None) -> ssl.SSLContext:
    import httpx

    return httpx.create_ssl_context()
