"""The control plane's side of a CA rotation (`llmgw ca rotate`, `llmgw.wire.tls`): noticing it, telling agents,
and retiring the old CA once no node waits for a certificate of the new one.

`keep_ca` reads the CA's directory every `CHECK_SECONDS` (`AgentsTls.refresh`: a rotation or a retirement made by
`llmgw ca rotate` in another process). When it changed, the agents' listener hands new connections the new trust
bundle and server certificate, and every mutual-TLS stream gets TrustCertificates (the bundle, and the CA that signs
now), upon which each agent renews its certificate under the new CA at once. While rotating, `rotation_progress`
says which nodes still wait (a live certificate of the old CA on record, or connected now, and none of the new CA);
once none does, the old CA is retired: from then on the listener trusts only the new CA, and a stream opened with a
certificate of the old one is ended (`certificate_refusal`), its agent connecting again with its new certificate.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

from llmgw.errors import TemporaryError, WireError
from llmgw.wire import control_message, pb

log = logging.getLogger("llmgw.control")

CHECK_SECONDS = 1.0
"""How often the CA's directory is read for a rotation, and a rotation's progress for the retirement."""


def trust_message(ca: Any) -> pb.ControlMessage:
    """TrustCertificates of `ca` (a `llmgw.wire.CertificateAuthority`): its trust bundle and the CA that signs."""
    return control_message(trust_certificates=pb.TrustCertificates(
        ca_pem=ca.certificate_pem, signing_ca_pem=ca.signing_certificate_pem))


def certified_nodes(hub: Any) -> list[str]:
    """The nodes connected to `hub` (an AgentHub) over mutual TLS now."""
    return [node_id for node_id, session in hub.sessions.items()
            if getattr(session.link, "peer_certificate_name", None)]


async def tell_agents(hub: Any, ca: Any) -> None:
    """Send TrustCertificates to every mutual-TLS stream of `hub` (a stream that went away meanwhile is skipped)."""
    message = trust_message(ca)
    for node_id in certified_nodes(hub):
        session = hub.sessions.get(node_id)
        if session is None:
            continue
        try:
            await session.send(message)
        except TemporaryError:
            pass  # the stream ended: its next one gets the message after Registered


async def keep_ca(hub: Any, agents_tls: Any, *, interval: float = CHECK_SECONDS,
                  on_change: Callable[[], None] = lambda: None,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Follow the CA of `agents_tls` (an `llmgw.wire.AgentsTls`) for `hub` until cancelled (see the module);
    `hub.ca_rotation` holds the progress of a rotation under way (None: none); `on_change()` (blocking: run in a
    thread) after each change (the admin listener's certificate issued again). Never raises for a CA that does not
    load (logged, tried again)."""
    ca = agents_tls.ca
    task_status.started()
    while True:
        try:
            changed = await trio.to_thread.run_sync(agents_tls.refresh)
            progress = await trio.to_thread.run_sync(ca.rotation_progress, certified_nodes(hub))
            if progress is not None and not progress["waiting"]:
                await trio.to_thread.run_sync(ca.retire)
                changed = await trio.to_thread.run_sync(agents_tls.refresh)
                log.info("retired the old agents' CA: every one of %d node(s) holds a certificate of the new one",
                         progress["nodes"])
                progress = None
            elif progress is not None and changed:
                log.info("a new agents' CA stands beside the old one; %d node(s) to move onto it", len(progress["waiting"]))
            hub.ca_rotation = progress
            if changed:
                await trio.to_thread.run_sync(on_change)
                await tell_agents(hub, ca)
        except (WireError, OSError) as exc:  # ssl.SSLError included
            log.warning("the agents' CA could not be followed (read again, retired, or its admin certificate issued "
                        "again): %s", exc)
        await trio.sleep(interval)
