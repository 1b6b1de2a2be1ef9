"""Agents over gRPC with mutual TLS: a node joins with a one-time token, registers under its certified id, and
one claiming another id is refused."""

from __future__ import annotations

import trio

from llmgw.control import ControlConfig, ControlPlane
from llmgw.errors import UsageError, WireError
from llmgw.wire import ClientTls, agent_message, connect, join, pb

from .test_in_process_fleet import wait_for


async def test_a_node_joins_with_a_token_and_may_register_only_under_its_certified_id(tmp_path, settings_repo):
    plane = ControlPlane(ControlConfig(repo=str(settings_repo), state_dir=tmp_path / "state", tls=True,
                                       gateway=False))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        grant = plane.create_join_token(60)
        certificate, key, ca = await join(f"127.0.0.1:{grant['join_port']}", grant["token"], "n7",
                                          grant["ca_pem"].encode())
        tls = ClientTls(ca_pem=ca, certificate_pem=certificate, key_pem=key)
        try:
            await join(f"127.0.0.1:{grant['join_port']}", grant["token"], "n8", grant["ca_pem"].encode())
            raise AssertionError("a join token worked twice")
        except WireError:
            pass

        async with connect(f"127.0.0.1:{plane.agents_port}", tls=tls) as link:
            await link.send(agent_message(register=pb.Register(node_id="n7", cpu_cores=2, memory_total_bytes=1 << 30)))
            welcome = await link.receive()
            assert welcome.WhichOneof("body") == "registered" and welcome.registered.node_id == "n7"
            await wait_for(lambda: plane.registry.get("n7") is not None, 5, "n7 registered")

        async with connect(f"127.0.0.1:{plane.agents_port}", tls=tls) as link:
            await link.send(agent_message(register=pb.Register(node_id="someone-else")))
            try:
                with trio.fail_after(5):
                    await link.receive()
                raise AssertionError("a node registered under another node's id")
            except (WireError, trio.EndOfChannel) as exc:
                assert "certificate names 'n7'" in str(exc) or isinstance(exc, trio.EndOfChannel)
        assert plane.registry.get("someone-else") is None
        nursery.cancel_scope.cancel()


async def test_a_plaintext_control_plane_issues_no_join_tokens(tmp_path, settings_repo):
    plane = ControlPlane(ControlConfig(repo=str(settings_repo), state_dir=tmp_path / "state", gateway=False))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        try:
            plane.create_join_token()
            raise AssertionError("expected a UsageError")
        except UsageError as exc:
            assert "--tls" in str(exc)
        nursery.cancel_scope.cancel()
