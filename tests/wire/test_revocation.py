"""Node identity over mutual TLS (issue 19, item 6): a Join for a node id that already holds a certificate is refused
until that certificate is revoked, and a revoked certificate is refused at once, on new and on open streams."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio
from click.testing import CliRunner

from llmgw.cli.main import cli, main
from llmgw.errors import WireError
from llmgw.wire import (
    PROTOCOL_VERSION, CertificateAuthority, CertificateExists, ClientTls, agent_message, connect, join, pb,
)
from llmgw.wire.tls import make_key_and_csr

from .conftest import ControlPlaneProcess


async def _join(plane: ControlPlaneProcess, node_id: str, token: str | None = None) -> ClientTls:
    assert plane.ca_dir is not None
    ca_pem = (plane.ca_dir / "ca.crt").read_bytes()
    token = token or CertificateAuthority.load_or_create(plane.ca_dir).create_join_token(60)
    certificate, key, _ = await join(plane.join_address, token, node_id, ca_pem)
    return ClientTls(ca_pem=ca_pem, certificate_pem=certificate, key_pem=key)


async def _register(plane: ControlPlaneProcess, tls: ClientTls, node_id: str) -> pb.ControlMessage:
    with trio.fail_after(20):
        async with connect(plane.address, tls=tls, timeout=10) as link:
            await link.send(agent_message(register=pb.Register(node_id=node_id)))
            return await link.receive()


async def _refusal(plane: ControlPlaneProcess, tls: ClientTls) -> str:
    """Why the control plane ends a stream opened with `tls` before reading anything: nothing is sent, so the answer
    is never hidden behind a failed send (it comes while connecting or at the first receive)."""
    with trio.fail_after(20), pytest.raises(WireError) as refused:
        async with connect(plane.address, tls=tls, timeout=10) as link:
            await link.receive()
    return str(refused.value)


def _revoke(plane: ControlPlaneProcess, node_id: str) -> str:
    result = CliRunner().invoke(cli, ["node", "revoke", node_id, "--ca-dir", str(plane.ca_dir)])
    assert result.exit_code == 0, result.output
    return result.output


async def test_a_second_join_under_a_certified_node_id_is_refused_and_keeps_its_token(
        tls_control_plane: ControlPlaneProcess) -> None:
    await _join(tls_control_plane, "node-a", tls_control_plane.token)
    second = CertificateAuthority.load_or_create(tls_control_plane.ca_dir).create_join_token(60)
    with pytest.raises(WireError, match="node 'node-a' already has a certificate.*llmgw node revoke node-a"):
        await _join(tls_control_plane, "node-a", second)
    joined = await _join(tls_control_plane, "node-b", second)  # the refusal did not use up the token
    assert (await _register(tls_control_plane, joined, "node-b")).registered.node_id == "node-b"


async def test_a_revoked_node_is_refused_and_may_join_again_with_a_new_token(
        tls_control_plane: ControlPlaneProcess) -> None:
    old = await _join(tls_control_plane, "node-a", tls_control_plane.token)
    assert (await _register(tls_control_plane, old, "node-a")).registered.node_id == "node-a"
    assert "revoked 1 certificate of node 'node-a'" in _revoke(tls_control_plane, "node-a")
    refusal = await _refusal(tls_control_plane, old)
    assert "certificate of node 'node-a' was revoked" in refusal and "llmgw node revoke" in refusal
    new = await _join(tls_control_plane, "node-a")  # revoking is what lets the same id join again
    assert (await _register(tls_control_plane, new, "node-a")).registered.node_id == "node-a"
    assert "was revoked" in await _refusal(tls_control_plane, old)  # the old certificate stays refused


async def test_revoking_a_node_ends_its_open_stream_within_two_seconds(tls_control_plane: ControlPlaneProcess) -> None:
    tls = await _join(tls_control_plane, "node-a", tls_control_plane.token)
    with trio.fail_after(30):
        async with connect(tls_control_plane.address, tls=tls, timeout=10) as link:
            await link.send(agent_message(register=pb.Register(node_id="node-a")))
            assert (await link.receive()).registered.node_id == "node-a"
            await link.send(agent_message(heartbeat=pb.Heartbeat(time=1.0)))
            assert (await link.receive()).command_id == f"{PROTOCOL_VERSION}:1"  # live up to the revocation
            _revoke(tls_control_plane, "node-a")
            revoked_at = time.monotonic()
            with pytest.raises(WireError, match="was revoked"):
                await link.receive()  # only receive: the control plane's status is not hidden by a failed send
            assert time.monotonic() - revoked_at < 2.0 + 0.5


def test_the_certificate_authority_records_issues_and_revocations(tmp_path: Path) -> None:
    ca = CertificateAuthority.load_or_create(tmp_path / "ca")
    _, csr = make_key_and_csr("n1")
    first = ca.sign_csr(csr, "n1")
    ca.record_certificate("n1", first)
    assert not ca.is_certificate_revoked(first) and not ca.is_revoked("n1")
    with pytest.raises(CertificateExists):
        ca.sign_csr(csr, "n1")
    assert ca.sign_csr(csr, "n1", replace=True)  # forced by a caller that means it
    assert ca.revoke("n1") == 1
    assert ca.is_certificate_revoked(first) and ca.is_revoked("n1")
    again = ca.sign_csr(csr, "n1")  # issued in the same second as the revocation
    ca.record_certificate("n1", again)
    assert not ca.is_certificate_revoked(again) and ca.is_certificate_revoked(first) and not ca.is_revoked("n1")
    # A certificate issued before the record existed (no entry) is revoked by node id all the same.
    _, csr2 = make_key_and_csr("n2")
    unrecorded = ca.sign_csr(csr2, "n2")
    assert ca.revoke("n2") == 0 and ca.is_certificate_revoked(unrecorded)


def test_revoke_without_a_ca_says_where_it_looked_and_makes_none(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["node", "revoke", "n1", "--state", str(tmp_path / "nothing")])
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert "holds no CA" in err and "--ca-dir" in err
    assert not (tmp_path / "nothing").exists()
