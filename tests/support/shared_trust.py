"""One default trust context per test process for the tests' own HTTPS-capable clients (issue 40).

httpx makes an `ssl.SSLContext` from certifi's CA bundle for every client made with its default `verify=True`, and
so does the openai SDK's own copy of httpx (`httpx2`), for every `AsyncOpenAI`: 50-60 ms of CPU each on the 2-core
machine. The tests make clients by the thousand (a client per poll, per request, per SDK user), nearly all for plain
HTTP to 127.0.0.1 where the context is never used; a py-spy profile of tests/control found 11 s of 85 s of the test
process's CPU there. The product's own clients share `llmgw.http_trust.default_verify()`; `install()` makes both
libraries' transports do the same for a client that asks for the default (`verify=True`, no `cert`): the same
context httpx would make, made once per process and per value of SSL_CERT_FILE / SSL_CERT_DIR. Any other `verify`
(a context of the test's own, a CA file, False) or a client certificate is passed on unchanged.
"""

from __future__ import annotations

import functools
import os
import ssl
from typing import Any, Callable

from llmgw.http_trust import default_verify


def _sharing(original: Callable[..., ssl.SSLContext], shared: Callable[[bool], ssl.SSLContext]):
    def create_ssl_context(verify: Any = True, cert: Any = None, trust_env: bool = True) -> ssl.SSLContext:
        if verify is True and not cert:
            return shared(trust_env)
        return original(verify=verify, cert=cert, trust_env=trust_env)

    create_ssl_context.original = original  # type: ignore[attr-defined]
    return create_ssl_context


def _httpx_default(trust_env: bool) -> ssl.SSLContext:
    if trust_env:
        return default_verify()
    return _untrusting_env()


@functools.cache
def _untrusting_env() -> ssl.SSLContext:
    import httpx

    return httpx.create_ssl_context(trust_env=False)


def _httpx2_default(trust_env: bool) -> ssl.SSLContext:
    env = (os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR")) if trust_env else None
    return _httpx2_context(trust_env, env)


@functools.cache
def _httpx2_context(trust_env: bool, env: tuple[str | None, str | None] | None) -> ssl.SSLContext:
    import httpx2

    return httpx2.create_ssl_context(trust_env=trust_env)


def install() -> Callable[[], None]:
    """Share the default context in this process's httpx and httpx2 transports; returns the undo."""
    import httpx._transports.default as httpx_transports

    undo = [(httpx_transports, httpx_transports.create_ssl_context)]
    httpx_transports.create_ssl_context = _sharing(httpx_transports.create_ssl_context, _httpx_default)
    try:
        import httpx2._transports.default as httpx2_transports
    except ImportError:  # the openai SDK without its own httpx
        pass
    else:
        undo.append((httpx2_transports, httpx2_transports.create_ssl_context))
        httpx2_transports.create_ssl_context = _sharing(httpx2_transports.create_ssl_context, _httpx2_default)

    def restore() -> None:
        for module, original in undo:
            module.create_ssl_context = original

    return restore
