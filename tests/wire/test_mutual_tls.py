"""Mutual TLS between processes: joining with a one-time token, connecting with the signed certificate, refusals."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest
import trio

from llmgw.errors import WireError
from llmgw.wire import CertificateAuthority, ClientTls, agent_message, connect, join, pb
from llmgw.wire.tls import certificate_common_name, make_key_and_csr

from .conftest import ControlPlaneProcess


def test_ca_is_created_once_with_a_private_key_file(tmp_path: Path) -> None:
    ca = CertificateAuthority.load_or_create(tmp_path / "ca")
    assert stat.S_IMODE(os.stat(tmp_path / "ca" / "ca.key").st_mode) == 0o600
    again = CertificateAuthority.load_or_create(tmp_path / "ca")
    assert again.certificate_pem == ca.certificate_pem


def test_ca_directory_with_only_a_certificate_is_refused(tmp_path: Path) -> None:
    ca = CertificateAuthority.load_or_create(tmp_path / "ca")
    (tmp_path / "ca" / "ca.key").unlink()
    with pytest.raises(WireError, match="only one of ca.key and ca.crt"):
        CertificateAuthority.load_or_create(ca.directory)


def test_signed_node_certificate_names_the_node_and_a_csr_for_another_node_is_refused(tmp_path: Path) -> None:
    ca = CertificateAuthority.load_or_create(tmp_path)
    _, csr = make_key_and_csr("gpu-7")
    assert certificate_common_name(ca.sign_csr(csr, "gpu-7")) == "gpu-7"
    with pytest.raises(WireError, match="names 'gpu-7', not the joining node 'gpu-8'"):
        ca.sign_csr(csr, "gpu-8")


def test_join_tokens_work_once_are_stored_hashed_and_expire(tmp_path: Path) -> None:
    ca = CertificateAuthority.load_or_create(tmp_path)
    token = ca.create_join_token(60)
    assert token not in (tmp_path / "join-tokens.json").read_text()
    assert ca.consume_join_token(token) is True
    assert ca.consume_join_token(token) is False
    expired = ca.create_join_token(0.01)  # the shortest life there is: a TTL must be positive (7 days at most)
    time.sleep(0.05)
    assert ca.consume_join_token(expired) is False
    assert ca.consume_join_token("llmgw-join-made-up") is False


async def _joined_tls(control_plane: ControlPlaneProcess, node_id: str) -> ClientTls:
    assert control_plane.ca_dir is not None and control_plane.token is not None
    ca_pem = (control_plane.ca_dir / "ca.crt").read_bytes()
    cert, key, returned_ca = await join(control_plane.join_address, control_plane.token, node_id, ca_pem)
    assert returned_ca == ca_pem
    assert certificate_common_name(cert) == node_id
    return ClientTls(ca_pem=ca_pem, certificate_pem=cert, key_pem=key)


async def test_node_joins_with_a_token_and_connects_with_its_certificate(
    tls_control_plane: ControlPlaneProcess, tmp_path: Path
) -> None:
    tls = await _joined_tls(tls_control_plane, "node-a")
    tls.save(tmp_path / "node")
    loaded = ClientTls.load(tmp_path / "node")
    assert stat.S_IMODE(os.stat(tmp_path / "node" / "node.key").st_mode) == 0o600
    async with connect(tls_control_plane.address, tls=loaded) as link:
        await link.send(agent_message(register=pb.Register(node_id="node-a")))
        reply = await link.receive()
    assert reply.registered.control_plane_version == "cert=node-a"  # the server saw the certificate's name


async def test_join_with_a_used_token_is_refused(tls_control_plane: ControlPlaneProcess) -> None:
    await _joined_tls(tls_control_plane, "node-a")
    with pytest.raises(WireError, match="refused to join node 'node-b'.*already used"):
        await _joined_tls(tls_control_plane, "node-b")


async def test_client_with_a_certificate_from_another_ca_is_refused(
    tls_control_plane: ControlPlaneProcess, tmp_path: Path
) -> None:
    assert tls_control_plane.ca_dir is not None
    other_ca = CertificateAuthority.load_or_create(tmp_path / "other-ca")
    key, csr = make_key_and_csr("intruder")
    foreign = ClientTls(
        ca_pem=(tls_control_plane.ca_dir / "ca.crt").read_bytes(),  # trusts the real server...
        certificate_pem=other_ca.sign_csr(csr, "intruder"),  # ...but shows a certificate it did not sign
        key_pem=key,
    )
    with trio.fail_after(20), pytest.raises(WireError, match="cannot reach the control plane"):
        async with connect(tls_control_plane.address, tls=foreign, timeout=10) as link:
            await link.send(agent_message(heartbeat=pb.Heartbeat()))
            await link.receive()


async def test_client_without_a_certificate_is_refused_on_both_ports(tls_control_plane: ControlPlaneProcess) -> None:
    assert tls_control_plane.ca_dir is not None
    server_only = ClientTls(ca_pem=(tls_control_plane.ca_dir / "ca.crt").read_bytes())
    for address in (tls_control_plane.address, tls_control_plane.join_address):
        with trio.fail_after(20), pytest.raises(WireError):
            async with connect(address, tls=server_only, timeout=10) as link:
                await link.send(agent_message(heartbeat=pb.Heartbeat()))
                await link.receive()


async def test_plaintext_agent_cannot_talk_to_a_tls_control_plane(tls_control_plane: ControlPlaneProcess) -> None:
    with trio.fail_after(20), pytest.raises(WireError, match="cannot reach the control plane"):
        async with connect(tls_control_plane.address, timeout=5):
            pass
