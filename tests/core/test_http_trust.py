"""llmgw's HTTPS clients share one default trust context per process (llmgw.http_trust): the same object each time,
verifying as httpx's own default does, and a new one when SSL_CERT_FILE names other certificates."""

from __future__ import annotations

import ssl

import certifi
import httpx

from llmgw.http_trust import default_verify


def test_the_default_context_is_made_once_and_verifies_as_httpxs_default(monkeypatch) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    first = default_verify()
    assert default_verify() is first
    own = httpx.create_ssl_context()
    assert (first.verify_mode, first.check_hostname) == (ssl.CERT_REQUIRED, True) == (own.verify_mode,
                                                                                      own.check_hostname)
    assert len(first.get_ca_certs()) == len(own.get_ca_certs()) > 0


def test_another_cert_file_gets_a_context_of_its_own_that_trusts_it(monkeypatch, tmp_path) -> None:
    text = open(certifi.where()).read()
    first_pem = text[text.index("-----BEGIN CERTIFICATE-----"):text.index("-----END CERTIFICATE-----") + 25]
    bundle = tmp_path / "ca.pem"  # one CA instead of certifi's whole bundle
    bundle.write_text(first_pem + "\n")
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    context = default_verify()
    assert context is default_verify()
    assert len(context.get_ca_certs()) == 1
    monkeypatch.delenv("SSL_CERT_FILE")
    assert default_verify() is not context
