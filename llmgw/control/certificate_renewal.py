"""Signing an agent's renewed node certificate (the control plane's side of `llmgw.agent.renewal`).

A RenewCertificate is taken only on a stream opened over mutual TLS with a certificate naming the stream's node id
(the Register of that stream was checked against it), from a node whose certificates are not revoked, carrying the
node secret a Register would (`NodeIdentities.prove`, as for a Register with a certificate). The CSR must name the
node (`CertificateAuthority.sign_csr`); the new certificate is recorded in the CA's `nodes.json` beside the old one,
which stays valid until it expires (the agent's open streams still use it). The answer, a certificate or the reason
for none, goes back on the same stream as CertificateRenewed. `renewal_refusal` is the pure part.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import trio

from llmgw.errors import TemporaryError, WireError
from llmgw.wire import certificate_validity, control_message, pb

log = logging.getLogger("llmgw.control")


MAX_LIVE_CERTIFICATES = 5
"""A node holding this many unexpired certificates on record gets no more: an agent renews at a share of 825 days,
so it holds two at most, a few more after answers lost with their streams; a node asking in a loop would otherwise
grow nodes.json without end."""


def renewal_refusal(has_ca: bool, certified_name: str | None, node_id: str, live: int = 0) -> str | None:
    """Why a RenewCertificate of `node_id`'s stream is refused before anything is signed, or None. `has_ca`: this
    control plane serves agents under its own CA (`--tls`); `certified_name`: the common name of the certificate the
    stream was opened with (None: no certificate); `live`: the node's unexpired certificates on record. Pure."""
    if not has_ca:
        return ("this control plane has no CA of its own (started without --tls), so it renews no node certificate; "
                "renewal needs a control plane started with --tls.")
    if certified_name is None:
        return (f"node {node_id!r} asked to renew its certificate on a stream opened without one; a certificate is "
                "renewed only over mutual TLS.")
    if certified_name != node_id:
        return f"the stream's certificate names {certified_name!r}, not node {node_id!r}; nothing is signed."
    if live >= MAX_LIVE_CERTIFICATES:
        return (f"node {node_id!r} holds {live} unexpired certificates already, so no more is signed; if this node "
                f"really lost them, `llmgw node revoke {node_id}` and join it again.")
    return None


def _sign(ca: Any, node_id: str, csr_pem: bytes) -> bytes:
    if ca.is_revoked(node_id):
        raise WireError(f"node {node_id!r} was revoked (`llmgw node revoke`); it must join again with a join token.")
    refusal = renewal_refusal(True, node_id, node_id, ca.live_certificates(node_id))
    if refusal is not None:
        raise WireError(refusal)
    certificate = ca.sign_csr(csr_pem, node_id, replace=True)
    ca.record_certificate(node_id, certificate)
    return certificate


async def answer_renewal(ca: Any, identities: Any, session: Any, node_id: str, request: pb.RenewCertificate) -> None:
    """Check and sign `request` of `node_id` (see the module) and send the answer on `session`. A checkpoint; never
    raises for a refusal (it is the answer) nor for a stream that went away meanwhile (nothing to answer)."""
    certificate, error = b"", renewal_refusal(ca is not None, getattr(session.link, "peer_certificate_name", None),
                                              node_id)
    if error is None:
        try:
            await identities.prove(node_id, request.node_secret, certified=True)
            certificate = await trio.to_thread.run_sync(_sign, ca, node_id, request.csr_pem)
            end = time.strftime("%Y-%m-%d", time.gmtime(certificate_validity(certificate)[1]))
            log.info("renewed the certificate of node %s (valid until %s)", node_id, end)
        except WireError as exc:
            error = str(exc)
        except OSError as exc:  # the CA's files could not be read or written
            error = f"the control plane could not record the certificate ({exc}); the agent asks again later."
    if error is not None:
        log.warning("refused to renew the certificate of node %s: %s", node_id, error)
    try:
        await session.send(control_message(certificate_renewed=pb.CertificateRenewed(
            certificate_pem=certificate, error=error or "")))
    except TemporaryError:
        pass  # the stream ended: the agent asks again on its next one
