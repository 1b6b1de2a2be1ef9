"""Node certificates renewed over the agent's stream before they expire: when (pure, and on trio's MockClock), what
the control plane refuses, and one real renewal by a real `llmgw agent` over mutual TLS, which then reconnects with
the new certificate once the old one is revoked."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio
import trio.testing
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization

from llmgw.agent.renewal import RETRY_SECONDS, CertificateRenewer, renewal_delay, renewal_time
from llmgw.control.certificate_renewal import renewal_refusal
from llmgw.wire import CertificateAuthority, ClientTls, certificate_validity, pb
from llmgw.wire.tls import make_key_and_csr

from .conftest import write_seed

DAY = 86400.0


@pytest.mark.parametrize("start, end, fraction, now, delay", [
    (0.0, 825 * DAY, 0.6667, 0.0, 0.6667 * 825 * DAY),     # a new 825-day certificate: 550 days
    (0.0, 90 * DAY, 2 / 3, 59 * DAY, 1 * DAY),
    (0.0, 90 * DAY, 2 / 3, 61 * DAY, 0.0),                 # overdue: now
    (0.0, 90 * DAY, 0.5, 0.0, 45 * DAY),
    (0.0, 90 * DAY, 0.0, 0.0, 0.6667 * 90 * DAY),          # a fraction out of (0, 1): the default
    (0.0, 90 * DAY, float("nan"), 0.0, 0.6667 * 90 * DAY),
    (0.0, 90 * DAY, 0.5, 100 * DAY, 0.0),                  # expired: now (the control plane refuses; logged)
])
def test_the_renewal_comes_after_the_given_share_of_the_lifetime(start, end, fraction, now, delay):
    assert renewal_delay(start, end, fraction, now) == pytest.approx(delay)
    assert renewal_time(start, end, fraction) >= start


@pytest.mark.parametrize("has_ca, certified, node, live, refused", [
    (True, "n1", "n1", 0, None),
    (True, "n1", "n1", 4, None),
    (True, "n1", "n1", 5, "holds 5 unexpired certificates"),
    (False, "n1", "n1", 0, "without --tls"),
    (True, None, "n1", 0, "only over mutual TLS"),
    (True, "n2", "n1", 0, "names 'n2', not node 'n1'"),
])
def test_a_renewal_is_signed_only_over_mutual_tls_for_the_streams_own_node(has_ca, certified, node, live, refused):
    said = renewal_refusal(has_ca, certified, node, live)
    assert (said is None) if refused is None else (refused in said)


def _certificate(ca_dir: Path, node_id: str, start: float, end: float) -> tuple[bytes, bytes]:
    """A node certificate for `node_id` valid from `start` to `end` (unix seconds), signed with the CA's key in
    `ca_dir` as the control plane signs one, but with any validity (an old certificate): (cert PEM, key PEM)."""
    ca_key = serialization.load_pem_private_key((ca_dir / "ca.key").read_bytes(), password=None)
    ca_cert = x509.load_pem_x509_certificate((ca_dir / "ca.crt").read_bytes())
    key_pem, csr_pem = make_key_and_csr(node_id)
    key = serialization.load_pem_private_key(key_pem, password=None)
    utc = datetime.timezone.utc
    cert = (x509.CertificateBuilder().subject_name(x509.load_pem_x509_csr(csr_pem).subject)
            .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(datetime.datetime.fromtimestamp(start, utc))
            .not_valid_after(datetime.datetime.fromtimestamp(end, utc))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def renewer_on_mock_clock(tls: Path, base: float):
    """A CertificateRenewer of node n1 in `tls` whose wall clock is `base` (unix seconds) now and follows trio's
    clock, the requests it sends (`(seconds since now, RenewCertificate)`) and the `send` that records them."""
    began = trio.current_time()
    renewer = CertificateRenewer(tls, "n1", lambda: 2 / 3, lambda: "secret",
                                 wall=lambda: base + trio.current_time() - began)
    sent: list[tuple[float, pb.RenewCertificate]] = []
    return renewer, sent, lambda m: sent.append((trio.current_time() - began, m.renew_certificate))


async def test_on_mock_clock_the_agent_asks_at_two_thirds_retries_unanswered_and_installs_the_answer(
        tmp_path, autojump_clock):
    """A 90-day certificate: no request before day 60, one at day 60; unanswered, a new one (a new key) after
    RETRY_SECONDS; the answer for the second key is installed (node.crt and node.key replaced, matching), and the
    next request waits for two thirds of the new certificate's lifetime."""
    ca = CertificateAuthority.load_or_create(tmp_path / "ca")
    base = time.time()
    tls = tmp_path / "tls"
    cert, key = _certificate(tmp_path / "ca", "n1", base, base + 90 * DAY)
    ClientTls(ca_pem=ca.certificate_pem, certificate_pem=cert, key_pem=key).save(tls)
    renewer, sent, send = renewer_on_mock_clock(tls, base)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(renewer.run, send)
        await trio.sleep(59.9 * DAY)
        assert sent == []
        await trio.sleep(0.1 * DAY + 60)
        assert [at for at, _ in sent] == [pytest.approx(60 * DAY, abs=1.0)]
        assert sent[0][1].node_secret == "secret"
        await trio.sleep(RETRY_SECONDS)
        assert len(sent) == 2 and sent[1][1].csr_pem != sent[0][1].csr_pem  # asked again, with a new key
        renewed = ca.sign_csr(sent[1][1].csr_pem, "n1", replace=True)
        renewer.accept(pb.CertificateRenewed(certificate_pem=renewed))
        assert renewer.renewed == 1 and (tls / "node.crt").read_bytes() == renewed
        loaded = ClientTls.load(tls)
        assert loaded.key_pem != key and sorted(p.name for p in tls.iterdir()) == ["ca.crt", "node.crt", "node.key"]
        start, end = certificate_validity(renewed)
        await trio.sleep(RETRY_SECONDS * 2)
        assert len(sent) == 2  # the new certificate is not due for 550 days
        nursery.cancel_scope.cancel()
    assert renewal_time(start, end, 2 / 3) - start == pytest.approx(550 * DAY, abs=DAY)  # signed for 825 days


def test_a_refused_or_foreign_answer_leaves_the_certificate_and_a_crashed_swap_is_completed(tmp_path):
    ca = CertificateAuthority.load_or_create(tmp_path / "ca")
    other = CertificateAuthority.load_or_create(tmp_path / "other")
    tls = tmp_path / "tls"
    cert, key = _certificate(tmp_path / "ca", "n1", time.time() - 2 * DAY, time.time() + DAY)
    ClientTls(ca_pem=ca.certificate_pem, certificate_pem=cert, key_pem=key).save(tls)
    sent = []
    renewer = CertificateRenewer(tls, "n1", lambda: 2 / 3, lambda: "s")

    async def ask():
        with trio.move_on_after(0.5):
            await renewer.run(sent.append)

    trio.run(ask)
    csr = sent[0].renew_certificate.csr_pem
    for answer in (pb.CertificateRenewed(error="no CA"), pb.CertificateRenewed(certificate_pem=other.sign_csr(csr, "n1")),
                   pb.CertificateRenewed(certificate_pem=ca.sign_csr(make_key_and_csr("n1")[1], "n1", replace=True))):
        renewer.accept(answer)
        assert (tls / "node.crt").read_bytes() == cert and renewer.renewed == 0
    # a crash between the two renames: the new key in place, the new certificate still beside it
    (tls / "node.next.crt").write_bytes(b"NEW CERT")
    (tls / "node.key").write_bytes(b"NEW KEY")
    assert ClientTls.load(tls).certificate_pem == b"NEW CERT" and not (tls / "node.next.crt").exists()


LLMGW = [sys.executable, "-m", "llmgw.cli"]


async def test_a_real_agent_renews_over_its_stream_and_reconnects_with_the_new_certificate(
        tmp_path):
    """`llmgw agent` whose certificate is past two thirds of its life renews it over its mutual-TLS stream: the
    control plane's CA signs a new one (recorded in nodes.json), the agent writes it; once the old one is revoked the
    control plane ends that stream and the agent comes back with the new certificate."""
    from llmgw.control import ControlConfig, ControlPlane
    from llmgw.settings import init_repository

    repo = tmp_path / "settings.git"
    init_repository(repo, write_seed(tmp_path / "seed", "a" * 64, replicas=0))  # nothing to run: no engine needed
    plane = ControlPlane(ControlConfig(repo=str(repo), state_dir=tmp_path / "cp", tls=True,
                                       gateway=False))
    state = tmp_path / "n1"
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        ca_dir = tmp_path / "cp" / "ca"
        old_start = time.time() - 2 * DAY
        cert, key = _certificate(ca_dir, "n1", old_start, time.time() + DAY)  # due since a day ago
        ClientTls(ca_pem=(ca_dir / "ca.crt").read_bytes(), certificate_pem=cert, key_pem=key).save(state / "tls")
        agent = subprocess.Popen([*LLMGW, "agent", "--control-plane", f"127.0.0.1:{plane.agents_port}",
                                  "--node-id", "n1", "--state-dir", str(state), "--heartbeat-interval", "200ms",
                                  "--no-bandwidth-probe"],
                                 stdout=subprocess.DEVNULL, stderr=open(tmp_path / "agent.log", "wb"))
        try:
            began = trio.current_time()
            with trio.fail_after(60):
                while (state / "tls" / "node.crt").read_bytes() == cert:
                    await trio.sleep(0.05)
            renewed_after = trio.current_time() - began
            new = (state / "tls" / "node.crt").read_bytes()
            start, end = certificate_validity(new)
            assert end - start > 800 * DAY
            tls = ClientTls.load(state / "tls")
            assert tls.key_pem != key
            serial = format(x509.load_pem_x509_certificate(new).serial_number, "x")
            record = json.loads((ca_dir / "nodes.json").read_text())
            assert serial in [issued["serial"] for issued in record["n1"]["issued"]]
            assert not CertificateAuthority.load_or_create(ca_dir).is_certificate_revoked(new)

            record["n1"]["revoked_before"] = old_start + 1  # the old certificate (not on record) is now revoked
            (ca_dir / "nodes.json").write_text(json.dumps(record))
            assert CertificateAuthority.load_or_create(ca_dir).is_certificate_revoked(cert)
            first = plane.agents.sessions["n1"]
            with trio.fail_after(30):
                while plane.agents.sessions.get("n1") in (None, first):
                    await trio.sleep(0.05)
            assert plane.registry.get("n1") is not None
            print(f"renewed {renewed_after:.1f} s after the agent started")
        finally:
            agent.terminate()
            agent.wait(timeout=30)
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("days_left, warned", [(3649.5, None), (181.5, None), (179.5, "in 179 days"),
                                               (-1.5, "expired")])
def test_llmgw_status_shows_the_cas_expiry_and_warns_six_months_ahead(days_left, warned):
    from llmgw.cli.server_cmds import render_status
    from llmgw.control.status import ca_expiry

    now = 1_800_000_000.0
    doc = ca_expiry(now + days_left * DAY, now)
    assert doc["days_left"] == int(days_left // 1)
    lines = render_status({"control_plane": {"ca": doc}})
    assert any(line.startswith("agents' CA  valid until ") for line in lines)
    warning = [line for line in lines if line.startswith("WARNING")]
    assert (warning == []) if warned is None else (warned in warning[0] and "join again" in warning[0])
    assert ca_expiry(None, now) is None  # no CA (no --tls): nothing shown


def test_agent_settings_set_the_fraction_and_an_older_control_planes_zero_keeps_it():
    from llmgw.agent import AgentConfig

    config = AgentConfig(node_id="n1", state_dir=Path("/nonexistent"))
    assert config.with_settings(pb.AgentSettings(certificate_renew_fraction=0.5)).certificate_renew_fraction == 0.5
    assert config.with_settings(pb.AgentSettings()).certificate_renew_fraction == pytest.approx(2 / 3, abs=1e-3)
    assert config.with_settings(pb.AgentSettings(certificate_renew_fraction=5.0)).certificate_renew_fraction < 1
