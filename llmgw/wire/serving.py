"""The control plane's side of the wire: a gRPC server whose Connect streams become trio Links.

`serve_agents` runs grpc.aio on the gRPC thread (aio_thread.py; callers only use trio). Each Connect stream is
handed to `handler(link, peer)` as a task of serve_agents' own nursery, on the trio thread; so is everything the
servicer asks of the join authority. The handler's return ends the RPC with
status OK (after every message it sent is written); an RPC that ends first (the agent went away, a keepalive
failed, the server stops) cancels the handler. The Join RPC signs node certificates (see tls.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import grpc
import trio

from llmgw.errors import LlmgwError, WireError

from . import agent_pb2 as pb
from . import agent_pb2_grpc as pb_grpc
from .aio_thread import call_in_trio, run_aio, to_trio
from .grpc_link import GrpcLink, server_options
from .link import ControlLink
from .messages import PROTOCOL_VERSION
from .tls import REVOCATION_CHECK_SECONDS, CertificateExists, ServerTls

Handler = Callable[[ControlLink, str], Awaitable[None]]

STOP_GRACE_SECONDS = 2.0
"""How long a stopping server lets open streams finish before cancelling them."""


class JoinAuthority(Protocol):
    """What answers Join requests and knows revoked node certificates: CertificateAuthority fits."""

    certificate_pem: bytes

    def consume_join_token(self, token: str) -> bool: ...

    def sign_csr(self, csr_pem: bytes, node_id: str) -> bytes: ...

    def record_certificate(self, node_id: str, certificate_pem: bytes) -> None: ...

    def certificate_refusal(self, certificate_pem: bytes) -> str | None: ...


class BoundPort(int):
    """The port serve_agents bound for Connect (an int), with `join_port`: the port answering Join (None if none)."""

    join_port: int | None

    def __new__(cls, port: int, join_port: int | None = None) -> BoundPort:
        self = super().__new__(cls, port)
        self.join_port = join_port
        return self


class _Servicer(pb_grpc.ControlPlaneServicer):
    def __init__(
        self, handler: Handler, nursery: trio.Nursery | None, token: trio.lowlevel.TrioToken,
        require_certificate: bool, join: JoinAuthority | None,
    ) -> None:
        self._handler = handler
        self.nursery = nursery
        self._token = token
        self._require_certificate = require_certificate
        self._join = join

    async def Connect(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:  # noqa: N802
        certificate_name = None
        certificate_pem = None
        if self._require_certificate:
            auth = context.auth_context()
            names = auth.get("x509_common_name")
            if not names:
                await context.abort(
                    grpc.StatusCode.UNAUTHENTICATED,
                    "this port answers agents with a node certificate only; join first (`llmgw node join`).",
                )
            certificate_name = names[0].decode()
            certificate_pem = (auth.get("x509_pem_cert") or [b""])[0]
            if self._join is not None:
                if not certificate_pem:
                    await context.abort(grpc.StatusCode.UNAUTHENTICATED, "the node certificate did not come through.")
                try:
                    refusal = await call_in_trio(self._token, self._join.certificate_refusal, certificate_pem)
                except WireError as exc:  # the record of revocations is unreadable: refuse rather than guess
                    await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
                if refusal is not None:
                    await context.abort(grpc.StatusCode.PERMISSION_DENIED, refusal)
        if self.nursery is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the control plane is starting; try again.")
        assert self.nursery is not None
        await context.send_initial_metadata(())
        link: GrpcLink[pb.ControlMessage, pb.AgentMessage] = GrpcLink(
            self._token, context.read, context.write, None, pb.ControlMessage, context.peer(), certificate_name
        )
        link.start()
        loop = asyncio.get_running_loop()
        finished: asyncio.Future[str | None] = loop.create_future()
        scope = trio.CancelScope()
        revoked: list[str] = []
        watch = trio.CancelScope() if self._join is not None and certificate_pem and certificate_name else None

        def settle(outcome: str | None) -> None:  # gRPC thread
            if not finished.done():
                finished.set_result(outcome)

        def spawn() -> None:  # trio thread
            assert self.nursery is not None
            try:
                if watch is not None:
                    self.nursery.start_soon(self._watch_revocation, certificate_pem, certificate_name, scope, watch,
                                            revoked)
                self.nursery.start_soon(self._run_handler, link, scope, loop, settle, watch, revoked,
                                        name=f"agent stream {link.peer}")
            except RuntimeError:  # serve_agents' nursery is closing: the server stops
                loop.call_soon_threadsafe(settle, "the control plane is stopping; connect again.")

        to_trio(self._token, spawn)
        try:
            error = await asyncio.shield(finished)
            if link.writer is not None and not link.writer.done():
                await asyncio.wait([link.writer], timeout=STOP_GRACE_SECONDS)
        except asyncio.CancelledError:
            to_trio(self._token, scope.cancel)  # the RPC ended first: the handler goes too
            link.fail("the RPC ended")
            raise
        finally:
            link.stop_pumps()
        if error is not None:
            await context.abort(grpc.StatusCode.ABORTED, error)

    async def _watch_revocation(self, certificate_pem: bytes, name: str, stream: trio.CancelScope,
                                watch: trio.CancelScope, revoked: list[str]) -> None:
        """Every REVOCATION_CHECK_SECONDS, end the stream (`stream` cancelled, the reason in `revoked`) once its
        certificate is revoked or its CA retired (`certificate_refusal`), or when the record of revocations cannot be read. Ends when `watch` is cancelled
        (the stream ended first)."""
        assert self._join is not None
        with watch:
            while True:
                await trio.sleep(REVOCATION_CHECK_SECONDS)
                try:
                    reason = self._join.certificate_refusal(certificate_pem)
                except WireError as exc:  # the record of revocations is unreadable: end the stream, keep serving
                    reason = str(exc)
                if reason is not None:
                    revoked.append(reason)
                    stream.cancel()
                    return

    async def _run_handler(
        self, link: GrpcLink[pb.ControlMessage, pb.AgentMessage], scope: trio.CancelScope,
        loop: asyncio.AbstractEventLoop, settle: Callable[[str | None], None], watch: trio.CancelScope | None = None,
        revoked: list[str] | None = None,
    ) -> None:
        outcome: str | None = "the control plane stopped handling this agent."
        try:
            with scope:
                try:
                    await self._handler(link, link.peer)
                    outcome = None
                except trio.EndOfChannel:
                    outcome = None  # the agent closed its side and the handler let that end it
                except LlmgwError as exc:
                    outcome = str(exc)
        finally:
            if watch is not None:
                watch.cancel()
            if revoked:
                outcome = revoked[0]
            await link.aclose()
            loop.call_soon_threadsafe(settle, outcome)

    async def Join(self, request: pb.JoinRequest, context: grpc.aio.ServicerContext) -> pb.JoinResponse:  # noqa: N802
        if self._join is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this control plane does not accept joins.")
        join = self._join
        assert join is not None
        if not request.node_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the join request names no node id.")
        try:  # validate and sign first, so that a malformed request does not burn the token
            certificate = await call_in_trio(self._token, join.sign_csr, bytes(request.csr_pem), request.node_id)
        except CertificateExists as exc:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, str(exc))
        except WireError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if not await call_in_trio(self._token, join.consume_join_token, request.token):
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                "the join token is unknown, expired or already used; create a new one on the control plane.",
            )
        await call_in_trio(self._token, join.record_certificate, request.node_id, certificate)
        return pb.JoinResponse(
            protocol=PROTOCOL_VERSION, certificate_pem=certificate, ca_pem=self._join.certificate_pem
        )


async def serve_agents(
    handler: Handler,
    host: str,
    port: int,
    *,
    tls: ServerTls | None = None,
    join: JoinAuthority | None = None,
    join_port: int = 0,
    task_status: trio.TaskStatus[BoundPort] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the ControlPlane gRPC service until cancelled; call `handler(link, peer)` for each agent's stream.

    `host`/`port`: where to listen (port 0 picks a free one). `tls`: None listens in plaintext (tests, one
    trusted machine); a ServerTls requires every Connect to show a client certificate signed by its CA, and
    `link.peer_certificate_name` then holds that certificate's common name (the node id). `join`: the authority
    answering Join (a CertificateAuthority); it needs `tls` and listens on `join_port` (0: a free port) with
    server-only TLS, since a joining node has no certificate yet.
    `task_status.started(BoundPort(port, join_port))` reports the bound ports (BoundPort is an int).

    `handler` gets a Link (sends ControlMessage, receives AgentMessage) and the peer address
    ("ipv4:10.0.0.5:51234"). Its return ends the RPC with OK; an LlmgwError it raises ends the RPC with that
    sentence (the agent's receive raises WireError with it); trio.EndOfChannel escaping it counts as a normal end;
    any other exception is a bug and propagates out of serve_agents. An RPC that ends first cancels the handler.
    Raises: WireError if the address cannot be bound or `join` is given without `tls`.
    """
    if join is not None and tls is None:
        raise WireError("the Join service needs TLS (a ServerTls); without it nodes could not trust the answer.")
    servicer = _Servicer(handler, None, trio.lowlevel.current_trio_token(), tls is not None, join)

    async def bind() -> tuple[grpc.aio.Server, int, int | None]:
        server = grpc.aio.server(options=server_options())
        pb_grpc.add_ControlPlaneServicer_to_server(servicer, server)
        address = f"{host}:{port}"
        bound, bound_join = 0, None
        try:
            if tls is None:
                bound = server.add_insecure_port(address)
            else:
                bound = server.add_secure_port(address, tls.credentials(require_client_certificate=True))
            if join is not None and tls is not None:
                bound_join = server.add_secure_port(
                    f"{host}:{join_port}", tls.credentials(require_client_certificate=False)
                )
        except RuntimeError:
            pass  # grpc says only "Failed to bind"; its log line has the errno
        if not bound or bound_join == 0:
            where = address if not bound else f"{host}:{join_port} (the join port)"
            await server.stop(None)
            raise WireError(
                f"cannot listen for agents on {where}: the address is in use or not on this machine; "
                "choose another port or stop the process using it."
            )
        return server, bound, bound_join

    server, bound, bound_join = await run_aio(bind)
    try:
        async with trio.open_nursery() as nursery:
            servicer.nursery = nursery
            await run_aio(server.start)
            task_status.started(BoundPort(bound, bound_join))
            await trio.sleep_forever()
    finally:
        with trio.move_on_after(STOP_GRACE_SECONDS + 3, shield=True):
            await run_aio(server.stop, STOP_GRACE_SECONDS)
