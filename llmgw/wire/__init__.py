"""llmgw.wire: the agent <-> control plane protocol (agent.proto), its generated code and the trio bridge.

    pb                    the generated message module (agent_pb2)
    PROTOCOL_VERSION      the version every message carries
    agent_message(...)    an AgentMessage stamped with the version; control_message(...) likewise
    Link                  one agent's stream: send / receive / aclose, async-iterable
    memory_link_pair()    (agent end, control end) in one process, for `llmgw up`
    serve_agents(...)     the control plane's gRPC server: handler(link, peer) per agent stream
    connect(...)          the agent's stream to a control plane, as an async context manager yielding a Link
    join(...)             a node's one-time-token exchange for a certificate (mTLS)
    tls                   CertificateAuthority, ServerTls, ClientTls, make_key_and_csr

grpc.aio runs on its own thread's asyncio loop (aio_thread.py), started on first use; no caller sees asyncio.
"""

import os

# gRPC's C core logs every failed TLS handshake to stderr at INFO; llmgw reports them as WireError sentences.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from . import tls  # noqa: E402
from .connecting import connect, join  # noqa: E402
from .link import AgentLink, ControlLink, Link, memory_link_pair  # noqa: E402
from .messages import PROTOCOL_VERSION, agent_message, control_message, pb  # noqa: E402
from .serving import BoundPort, Handler, JoinAuthority, serve_agents  # noqa: E402
from .tls import (  # noqa: E402
    AgentsTls, CertificateAuthority, CertificateExists, ClientTls, ServerTls, certificate_validity,
    check_agents_listener, check_renewed, install_renewed, signed_by_any,
)

__all__ = [
    "PROTOCOL_VERSION",
    "AgentLink",
    "AgentsTls",
    "BoundPort",
    "CertificateAuthority",
    "CertificateExists",
    "certificate_validity",
    "check_renewed",
    "install_renewed",
    "signed_by_any",
    "ClientTls",
    "ControlLink",
    "Handler",
    "JoinAuthority",
    "Link",
    "ServerTls",
    "agent_message",
    "check_agents_listener",
    "connect",
    "control_message",
    "join",
    "memory_link_pair",
    "pb",
    "serve_agents",
    "tls",
]
