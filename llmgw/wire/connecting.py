"""The agent's side of the wire: `connect` opens the Connect stream as a Link, `join` obtains a node certificate.

Both run grpc.aio on the gRPC thread (aio_thread.py), so callers only use trio.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc
import trio

from llmgw.errors import WireError

from . import agent_pb2 as pb
from . import agent_pb2_grpc as pb_grpc
from .aio_thread import on_loop, run_aio
from .grpc_link import GrpcLink, agent_channel_options, describe_rpc_error
from .link import AgentLink
from .messages import PROTOCOL_VERSION
from .tls import ClientTls, make_key_and_csr

CONNECT_TIMEOUT_SECONDS = 10.0
CLOSE_GRACE_SECONDS = 1.0
"""After closing its side, how long the agent waits for the control plane to end the RPC before cancelling it."""


async def _channel(address: str, tls: ClientTls | None) -> grpc.aio.Channel:
    """A grpc.aio channel; created on the asyncio side, since grpc.aio binds it to the running loop."""
    if tls is None:
        return grpc.aio.insecure_channel(address, options=agent_channel_options())
    return grpc.aio.secure_channel(address, tls.credentials(), options=agent_channel_options() + tls.channel_options())


def _unreachable(address: str, exc: BaseException, tls: ClientTls | None) -> WireError:
    if isinstance(exc, grpc.aio.AioRpcError) and exc.code() == grpc.StatusCode.PERMISSION_DENIED:
        return WireError(f"the control plane at {address} refused this node: {exc.details()}")  # e.g. revoked
    hint = (
        "check that this node's certificate was signed by the control plane's CA (join again if not) and that the "
        "address matches the server certificate"
        if tls is not None
        else "check that `llmgw server` runs there and that the port is open (and whether it requires TLS)"
    )
    return WireError(f"cannot reach the control plane at {address} ({describe_rpc_error(exc)}); {hint}.")


@asynccontextmanager
async def connect(
    address: str, *, tls: ClientTls | None = None, timeout: float = CONNECT_TIMEOUT_SECONDS
) -> AsyncIterator[AgentLink]:
    """Open the agent's stream to the control plane at `address` ("host:port") and yield it as a Link.

    The link sends AgentMessage and receives ControlMessage. `tls`: None for plaintext; a ClientTls with the node
    certificate for mutual TLS. `timeout`: seconds to wait for the control plane to answer.
    On exit the agent's side is closed (the control plane sees end of stream), the RPC is given
    CLOSE_GRACE_SECONDS to end, then cancelled. If the control plane ends the RPC, `receive` raises
    trio.EndOfChannel (status OK) or WireError (any other status, with the server's sentence).
    Raises: WireError with a sentence when the control plane cannot be reached, refuses the certificate, or does
    not answer within `timeout`.
    """
    token = trio.lowlevel.current_trio_token()
    channel = await run_aio(_channel, address, tls)
    try:

        async def open_stream() -> GrpcLink[pb.AgentMessage, pb.ControlMessage]:
            call: Any = pb_grpc.ControlPlaneStub(channel).Connect(wait_for_ready=False)
            try:
                await call.wait_for_connection()
            except grpc.aio.AioRpcError as exc:
                raise _unreachable(address, exc, tls) from exc
            link: GrpcLink[pb.AgentMessage, pb.ControlMessage] = GrpcLink(
                token, call.read, call.write, call.done_writing, pb.AgentMessage, address
            )
            link.call = call  # type: ignore[attr-defined]
            link.start()
            return link

        with trio.move_on_after(timeout) as deadline:
            link = await run_aio(open_stream)
        if deadline.cancelled_caught:
            raise WireError(
                f"the control plane at {address} did not answer within {timeout:g} s; "
                "check the address and that `llmgw server` is running there."
            )
        try:
            yield link
        finally:
            await link.aclose()
            with trio.move_on_after(CLOSE_GRACE_SECONDS, shield=True):
                await link.wait_written(CLOSE_GRACE_SECONDS)
                reader = link.reader
                if reader is not None and not reader.done():
                    await run_aio(_wait, reader)
            on_loop(link.call.cancel)  # type: ignore[attr-defined]
            link.stop_pumps()
    finally:
        with trio.move_on_after(2, shield=True):
            await run_aio(channel.close)


async def _wait(task: Any) -> None:
    import asyncio

    await asyncio.wait([task])


async def join(
    address: str, token: str, node_id: str, ca_pem: bytes, *, timeout: float = CONNECT_TIMEOUT_SECONDS
) -> tuple[bytes, bytes, bytes]:
    """Join the fleet: send a one-time `token` and a fresh CSR for `node_id` to the control plane's join port.

    `address` is "host:join_port"; `ca_pem` is the control plane's CA certificate (given with the token), used to
    verify the server. Returns (certificate PEM, private key PEM, CA PEM); save them with ClientTls(...).save().
    Raises: WireError when the server cannot be reached or refuses (used or expired token, bad request).
    """
    key_pem, csr_pem = make_key_and_csr(node_id)
    tls = ClientTls(ca_pem=ca_pem)
    channel = await run_aio(_channel, address, tls)

    async def call() -> pb.JoinResponse:
        stub = pb_grpc.ControlPlaneStub(channel)
        request = pb.JoinRequest(protocol=PROTOCOL_VERSION, token=token, node_id=node_id, csr_pem=csr_pem)
        return await stub.Join(request, timeout=timeout)

    try:
        response = await run_aio(call)
    except grpc.aio.AioRpcError as exc:
        if exc.code() in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.INVALID_ARGUMENT,
                          grpc.StatusCode.ALREADY_EXISTS):
            raise WireError(f"the control plane at {address} refused to join node {node_id!r}: {exc.details()}") from exc
        raise _unreachable(address, exc, tls) from exc
    finally:
        with trio.move_on_after(2, shield=True):
            await run_aio(channel.close)
    if response.error:
        raise WireError(f"the control plane at {address} refused to join node {node_id!r}: {response.error}")
    return bytes(response.certificate_pem), key_pem, bytes(response.ca_pem)
