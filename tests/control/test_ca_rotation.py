"""`llmgw ca rotate`: a new agents' CA beside the old one, agents moved onto it over their streams without joining
again, the old CA retired once no node waits, and its certificates refused from then on. The CA's files (pure
enough: a temporary directory), the agent's side on trio's MockClock, and real `llmgw agent` processes over mutual
TLS with a real control plane."""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio
import trio.testing

from llmgw.errors import WireError
from llmgw.wire import CertificateAuthority, ClientTls, agent_message, connect, join, pb, signed_by_any
from llmgw.wire.tls import make_key_and_csr

from .conftest import write_seed
from .test_certificate_renewal import renewer_on_mock_clock

DAY = 86400.0
LLMGW = [sys.executable, "-m", "llmgw.cli"]


def _node(ca: CertificateAuthority, node_id: str) -> tuple[bytes, bytes]:
    """A node certificate signed now by `ca` (recorded as a Join records it): (cert PEM, key PEM)."""
    key, csr = make_key_and_csr(node_id)
    cert = ca.sign_csr(csr, node_id, replace=True)
    ca.record_certificate(node_id, cert)
    return cert, key


def test_a_rotation_signs_with_the_new_ca_trusts_both_and_the_retirement_refuses_the_old(tmp_path):
    ca = CertificateAuthority.load_or_create(tmp_path / "ca")
    old_pem = ca.certificate_pem
    before, _ = _node(ca, "n1")
    _node(ca, "n2")
    assert ca.rotation_progress() is None and not ca.rotating
    ca.rotate()
    with pytest.raises(WireError, match="already stands beside the old one"):
        ca.rotate()
    assert ca.certificate_pem.startswith(old_pem) and ca.certificate_pem.count(b"BEGIN CERTIFICATE") == 2
    assert signed_by_any(ca.signing_certificate_pem, ca.certificate_pem)
    assert ca.signing_certificate_pem != old_pem
    progress = ca.rotation_progress(["n3"])  # n3: connected, with a certificate not on record
    assert (progress["nodes"], progress["moved"], progress["waiting"]) == (3, 0, ["n1", "n2", "n3"])
    after, _ = _node(ca, "n1")  # a renewal under the new CA
    assert signed_by_any(after, ca.signing_certificate_pem) and not signed_by_any(after, old_pem)
    assert ca.certificate_refusal(before) is None and ca.certificate_refusal(after) is None  # both trusted
    ca.revoke("n2")
    assert ca.rotation_progress()["waiting"] == []
    # another process (the control plane) sees the rotation and then the retirement
    other = CertificateAuthority.load_or_create(tmp_path / "ca")
    assert other.rotating and other.certificate_pem == ca.certificate_pem and not other.refresh()
    ca.retire()
    assert other.refresh() and not other.rotating
    assert other.certificate_pem == ca.signing_certificate_pem
    assert "no longer trusts" in other.certificate_refusal(before)
    assert other.certificate_refusal(after) is None
    assert sorted(p.name for p in (tmp_path / "ca").iterdir() if p.suffix in (".crt", ".key")) == ["ca.crt", "ca.key"]
    with pytest.raises(WireError, match="no new CA stands beside"):
        other.retire()
    # a node left on a retired CA (its certificate still on record, unexpired) may join again without a revoke
    _node(other, "n6")
    with pytest.raises(WireError, match="already has a certificate"):
        other.check_no_live_certificate("n6")
    other.rotate()
    _node(other, "n5")
    other.retire()
    other.check_no_live_certificate("n6")
    assert other.live_certificates("n6") == 0 and other.live_certificates("n5") == 1
    with pytest.raises(WireError, match="already has a certificate"):
        other.check_no_live_certificate("n5")


def test_a_retirement_a_crash_interrupted_is_completed_and_a_half_made_rotation_removed(tmp_path):
    ca = CertificateAuthority.load_or_create(tmp_path / "ca")
    ca.rotate()
    new = ca.signing_certificate_pem
    (tmp_path / "ca" / "ca.next.key").replace(tmp_path / "ca" / "ca.key")  # the key renamed, then the crash
    loaded = CertificateAuthority.load_or_create(tmp_path / "ca")
    assert not loaded.rotating and loaded.certificate_pem == new
    assert signed_by_any(_node(loaded, "n1")[0], new)
    (tmp_path / "ca" / "ca.next.key").write_bytes(b"half a rotation")  # the key written, the certificate not
    assert not CertificateAuthority.load_or_create(tmp_path / "ca").rotating
    assert not (tmp_path / "ca" / "ca.next.key").exists()


async def test_on_mock_clock_a_rotation_makes_the_agent_renew_at_once_and_take_the_bundle(tmp_path, autojump_clock):
    """A certificate issued today is not due for 550 days; TrustCertificates naming a new signing CA has the agent
    ask within a second, write the bundle to ca.crt, and install a certificate of the new CA; then it is quiet."""
    ca = CertificateAuthority.load_or_create(tmp_path / "ca")
    tls = tmp_path / "tls"
    cert, key = _node(ca, "n1")
    ClientTls(ca_pem=ca.certificate_pem, certificate_pem=cert, key_pem=key).save(tls)
    began = trio.current_time()
    renewer, sent, send = renewer_on_mock_clock(tls, time.time())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(renewer.run, send)
        await trio.sleep(30 * DAY)
        assert sent == []
        ca.rotate()
        told = trio.current_time() - began
        renewer.trust(pb.TrustCertificates(ca_pem=ca.certificate_pem, signing_ca_pem=ca.signing_certificate_pem))
        assert (tls / "ca.crt").read_bytes() == ca.certificate_pem
        await trio.sleep(1)
        assert [at for at, _ in sent] == [pytest.approx(told, abs=1.0)]
        renewer.accept(pb.CertificateRenewed(certificate_pem=ca.sign_csr(sent[0][1].csr_pem, "n1", replace=True)))
        assert renewer.renewed == 1 and signed_by_any((tls / "node.crt").read_bytes(), ca.signing_certificate_pem)
        await trio.sleep(400 * DAY)
        assert len(sent) == 1  # the new certificate waits for its own renewal point
        # a trust bundle that does not hold the CA said to sign is not taken, nor one without this node's CA (a
        # control plane that has not seen the rotation: the old CA only)
        other = CertificateAuthority.load_or_create(tmp_path / "other")
        renewer.trust(pb.TrustCertificates(ca_pem=other.certificate_pem, signing_ca_pem=ca.signing_certificate_pem))
        stale = ca.certificate_pem.split(b"-----END CERTIFICATE-----")[0] + b"-----END CERTIFICATE-----\n"
        renewer.trust(pb.TrustCertificates(ca_pem=stale, signing_ca_pem=stale))
        assert (tls / "ca.crt").read_bytes() == ca.certificate_pem and renewer.signing_ca != stale
        await trio.sleep(DAY)
        assert len(sent) == 1
        nursery.cancel_scope.cancel()


def _admin_verified(port: int, ca_file: Path) -> bool:
    """A TLS handshake with the admin listener on 127.0.0.1:`port`, its certificate verified with `ca_file`."""
    context = ssl.create_default_context(cafile=str(ca_file))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1"):
            return True


def _sessions(plane) -> dict[str, object]:
    return dict(plane.agents.sessions)


async def _until(predicate, seconds: float, what: str) -> float:
    began = trio.current_time()
    with trio.fail_after(seconds):
        while not predicate():
            await trio.sleep(0.05)
    return trio.current_time() - began


async def test_real_agents_move_onto_a_new_ca_without_dropping_a_stream_and_the_old_ca_is_refused_after(tmp_path):
    """Two real `llmgw agent`s joined under the old CA, and n3 offline with a live certificate of it on record.
    `llmgw ca rotate`: both agents renew under the new CA over their open streams (none dropped), n4 joining meanwhile
    gets a certificate of the new CA, `llmgw status` shows 3 of 4 nodes moved and n3 waited for; `llmgw node revoke n3` lets the control plane retire the old CA on
    its own; the agents' old-CA streams end and they come back with their new certificates, not joining again; a
    certificate of the old CA is refused at the handshake."""
    from llmgw.cli.server_cmds import render_status
    from llmgw.control import ControlConfig, ControlPlane
    from llmgw.settings import init_repository

    repo = tmp_path / "settings.git"
    init_repository(repo, write_seed(tmp_path / "seed", "a" * 64, replicas=0))  # nothing to run: no engine needed
    plane = ControlPlane(ControlConfig(repo=str(repo), state_dir=tmp_path / "cp", tls=True, admin_tls=True,
                                       gateway=False))
    nodes = ("n1", "n2")
    agents: list[subprocess.Popen] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        ca_dir = tmp_path / "cp" / "ca"
        ca = CertificateAuthority.load_or_create(ca_dir)
        old_ca = ca.certificate_pem
        old = {}
        for node_id in nodes:
            old[node_id] = _node(ca, node_id)
            ClientTls(ca_pem=old_ca, certificate_pem=old[node_id][0], key_pem=old[node_id][1]).save(
                tmp_path / node_id / "tls")
        _node(ca, "n3")  # a node that is off during the rotation
        try:
            for node_id in nodes:
                agents.append(subprocess.Popen(
                    [*LLMGW, "agent", "--control-plane", f"127.0.0.1:{plane.agents_port}", "--node-id", node_id,
                     "--state-dir", str(tmp_path / node_id), "--heartbeat-interval", "200ms", "--no-bandwidth-probe"],
                    stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"{node_id}.log", "wb")))
            await _until(lambda: set(plane.agents.sessions) == set(nodes), 60, "both agents connected")
            first = _sessions(plane)
            assert await trio.to_thread.run_sync(_admin_verified, plane.endpoints.admin_port, ca_dir / "ca.crt")

            rotated = subprocess.run([*LLMGW, "ca", "rotate", "--state", str(tmp_path / "cp")],
                                     capture_output=True, text=True, timeout=60)
            assert rotated.returncode == 0, rotated.stderr
            assert "beside the old one" in rotated.stdout
            new_ca = (ca_dir / "ca.next.crt").read_bytes()

            def moved() -> bool:
                return all(signed_by_any((tmp_path / n / "tls" / "node.crt").read_bytes(), new_ca) for n in nodes)

            renewed_in = await _until(moved, 60, "both agents renewed under the new CA")
            again = subprocess.run([*LLMGW, "ca", "rotate", "--state", str(tmp_path / "cp")],
                                   capture_output=True, text=True, timeout=60)
            assert again.returncode == 1 and "already stands beside" in again.stderr and "Traceback" not in again.stderr
            for node_id in nodes:
                assert (tmp_path / node_id / "tls" / "ca.crt").read_bytes() == old_ca + new_ca  # the bundle
            # a node joining during the overlap with the CA file it was given before (the old CA alone) gets a
            # certificate of the new CA and both CAs to trust
            token = plane.create_join_token(600)
            joined, joined_key, bundle = await join(f"127.0.0.1:{token['join_port']}", token["token"], "n4", old_ca)
            assert signed_by_any(joined, new_ca) and bundle == old_ca + new_ca
            # and is let in over mutual TLS while both CAs are trusted (its stream reaches the control plane, which
            # wants a Register first)
            with trio.fail_after(30), pytest.raises(WireError, match="must be Register"):
                async with connect(f"127.0.0.1:{plane.agents_port}", timeout=10,
                                   tls=ClientTls(ca_pem=bundle, certificate_pem=joined, key_pem=joined_key)) as link:
                    await link.send(agent_message(heartbeat=pb.Heartbeat()))
                    await link.receive()
            await _until(lambda: (plane.agents.ca_rotation or {}).get("moved") == 3, 10, "progress seen")
            assert _sessions(plane) == first  # not one stream dropped during the overlap
            status = plane.reporter.status(readings=False)
            rotation = status["control_plane"]["ca_rotation"]
            assert (rotation["nodes"], rotation["moved"], rotation["waiting"]) == (4, 3, ["n3"])
            line = [line for line in render_status(status) if line.startswith("CA rotation")]
            assert "3 of 4 nodes" in line[0] and "waiting for n3" in line[0]
            assert (ca_dir / "ca.next.crt").exists()  # n3 still waited for: the old CA stays trusted

            revoked = subprocess.run([*LLMGW, "node", "revoke", "n3", "--state", str(tmp_path / "cp")],
                                     capture_output=True, text=True, timeout=60)
            assert revoked.returncode == 0, revoked.stderr
            retired_in = await _until(lambda: not (ca_dir / "ca.next.crt").exists(), 10, "the old CA retired")
            assert (ca_dir / "ca.crt").read_bytes() == new_ca
            back_in = await _until(lambda: set(plane.agents.sessions) == set(nodes)
                                   and all(plane.agents.sessions[n] is not first[n] for n in nodes), 30,
                                   "the agents came back on their new certificates")
            await _until(lambda: all((tmp_path / n / "tls" / "ca.crt").read_bytes() == new_ca for n in nodes), 10,
                         "the agents dropped the old CA")
            assert plane.agents.ca_rotation is None
            # the admin listener's certificate was issued again under the new CA: `llmgw status` verifies it
            assert await trio.to_thread.run_sync(_admin_verified, plane.endpoints.admin_port, ca_dir / "ca.crt")
            assert "ca_rotation" not in plane.reporter.status(readings=False)["control_plane"]
            for node_id in nodes:
                assert plane.registry.get(node_id) is not None
                assert sorted(p.name for p in (tmp_path / node_id / "tls").iterdir()) == [
                    "ca.crt", "node.crt", "node.key"]  # renewed in place: no join
            await trio.sleep(1.5)
            assert all(plane.agents.sessions[n] is not first[n] for n in nodes)

            assert CertificateAuthority.load_or_create(ca_dir).certificate_refusal(joined) is None
            # a certificate of the retired CA is refused now, even with the new CA trusted on the agent's side
            stale = ClientTls(ca_pem=new_ca, certificate_pem=old["n1"][0], key_pem=old["n1"][1])
            with trio.fail_after(30), pytest.raises(WireError, match="cannot reach the control plane"):
                async with connect(f"127.0.0.1:{plane.agents_port}", tls=stale, timeout=10) as link:
                    await link.send(agent_message(heartbeat=pb.Heartbeat()))
                    await link.receive()
            print(f"renewed onto the new CA {renewed_in:.1f} s after `llmgw ca rotate` returned; retired {retired_in:.1f} s "
                  f"after the last waited-for node was revoked; agents back {back_in:.1f} s after that")
        finally:
            for agent in agents:
                agent.terminate()
            for agent in agents:
                agent.wait(timeout=30)
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("finish", [False, True])
def test_llmgw_ca_rotate_without_a_ca_or_a_rotation_says_what_to_do(tmp_path, finish):
    said = subprocess.run([*LLMGW, "ca", "rotate", "--state", str(tmp_path), *(["--finish"] if finish else [])],
                          capture_output=True, text=True, timeout=60)
    assert said.returncode == 1 and "holds no CA" in said.stderr and "--state" in said.stderr
    CertificateAuthority.load_or_create(tmp_path / "ca")
    if finish:
        said = subprocess.run([*LLMGW, "ca", "rotate", "--state", str(tmp_path), "--finish"],
                              capture_output=True, text=True, timeout=60)
        assert said.returncode == 1 and "llmgw ca rotate" in said.stderr and "Traceback" not in said.stderr
