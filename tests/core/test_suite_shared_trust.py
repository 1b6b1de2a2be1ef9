"""The suite's httpx and openai SDK clients made with the default trust share one context per process
(tests/support/shared_trust.py, installed for the whole session by tests/conftest.py), the one httpx would make; a
client with trust of its own keeps it."""

from __future__ import annotations

import ssl

import httpx
import openai

from llmgw.http_trust import default_verify


def _context(client) -> ssl.SSLContext:
    return client._transport._pool._ssl_context


def test_default_clients_share_one_context_that_verifies_as_httpxs_own(monkeypatch) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    first, second = httpx.AsyncClient(), httpx.Client()
    assert _context(first) is _context(second) is default_verify()
    own = httpx.create_ssl_context()
    assert (_context(first).verify_mode, _context(first).check_hostname) == (ssl.CERT_REQUIRED, True)
    assert len(_context(first).get_ca_certs()) == len(own.get_ca_certs()) > 0


def test_openai_sdk_clients_share_one_context_of_their_own_library() -> None:
    one = openai.AsyncOpenAI(api_key="x", base_url="http://127.0.0.1:1/v1")
    two = openai.AsyncOpenAI(api_key="x", base_url="http://127.0.0.1:1/v1")
    assert _context(one._client) is _context(two._client)
    assert _context(one._client).verify_mode == ssl.CERT_REQUIRED


def test_a_client_with_trust_of_its_own_keeps_it() -> None:
    own = ssl.create_default_context()
    assert _context(httpx.AsyncClient(verify=own)) is own
    unverified = _context(httpx.AsyncClient(verify=False))
    assert unverified is not default_verify() and unverified.verify_mode == ssl.CERT_NONE
