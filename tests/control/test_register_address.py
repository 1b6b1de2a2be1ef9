"""A node's address is an IP literal or an RFC 1123 host name, checked at Register (issue 25, item 2): the address
goes into slurm.conf (`NodeAddr=`) and the other files every node reads, so a node reporting
"10.0.0.9\\nPrologSlurmctld=/x/evil.sh ..." must not join. The refusal reaches the agent as a sentence over a real
gRPC stream, and the node is never recorded."""

from __future__ import annotations

import pytest
import trio

from llmgw.control import ControlConfig, ControlPlane
from llmgw.control.reports import address_problem, check_register, node_from_register
from llmgw.errors import WireError
from llmgw.wire import agent_message, connect, pb

from .test_in_process_fleet import wait_for

SECRET = "n" * 43
"""The node secret the scripted agents prove their node id with (llmgw.control.node_identity)."""
INJECTION = "10.0.0.9\nPrologSlurmctld=/x/evil.sh\nProlog=/x/evil.sh #"
"""The reproduction of issue 25: one node's address adding root Prolog lines to every node's slurm.conf."""

HOSTILE = [
    INJECTION,
    "10.0.0.9 Prolog=/x/evil.sh",
    "10.0.0.9\tProlog=/x/evil.sh",
    "10.0.0.9\rProlog=/x/evil.sh",
    "10.0.0.9\x00",
    "node#1",
    "node=1",
    "node 1",
    "node1\n",
    " 10.0.0.9",
    "10.0.0.9 ",
    "-node1",
    "node1-",
    "node_1",
    "node1.",
    ".node1",
    "a..b",
    "a" * 64,
    ".".join(["a" * 63] * 3) + "." + "b" * 62,  # 254 characters
    "10.0.0.300",
    "10.0.0",
    "[::1]",
    "fe80::1%eth0",
    "fe80::1%eth0 Prolog=/x/evil.sh",
    "10.0.0.9:5000",
    "nöde1",
    "node1\u2028",
    "${HOST}",
    "node1,node2",
    "node1(evil)",
    '"quoted"',
]

VALID = [
    "10.0.0.9",
    "127.0.0.1",
    "0.0.0.0",
    "::1",
    "fd00::12:34",
    "2001:db8::8a2e:370:7334",
    "::ffff:10.0.0.9",
    "localhost",
    "gpu-node-01",
    "GPU-NODE-01.cluster.example.org",
    "3com.example",  # RFC 1123 allows a leading digit
    "n7",
    "a" * 63,
    ".".join(["a" * 63] * 3) + "." + "b" * 61,  # 253 characters, the most
]


@pytest.mark.parametrize("address", HOSTILE, ids=[repr(a)[:40] for a in HOSTILE])
def test_an_address_that_is_no_ip_literal_or_host_name_is_refused_with_a_sentence(address):
    assert address_problem(address)
    register = pb.Register(node_id="n1", address=address)
    with pytest.raises(WireError) as caught:
        check_register(register)
    message = str(caught.value)
    assert repr(address) in message and "is refused" in message and "--address" in message
    with pytest.raises(WireError):
        node_from_register(register)


@pytest.mark.parametrize("address", VALID)
def test_ip_literals_and_host_names_are_accepted_as_they_are(address):
    assert address_problem(address) is None
    assert node_from_register(pb.Register(node_id="n1", address=address)).address == address


def test_no_reported_address_takes_the_peers_host():
    assert node_from_register(pb.Register(node_id="n1"), "10.1.2.3").address == "10.1.2.3"


async def test_a_register_with_the_slurm_conf_injection_is_refused_and_the_node_never_joins(tmp_path, settings_repo):
    plane = ControlPlane(ControlConfig(repo=str(settings_repo), state_dir=tmp_path / "state", gateway=False))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        async with connect(f"127.0.0.1:{plane.agents_port}") as link:
            await link.send(agent_message(register=pb.Register(node_id="evil", address=INJECTION, cpu_cores=2, node_secret=SECRET,
                                                               memory_total_bytes=1 << 30)))
            with pytest.raises(WireError) as caught:
                with trio.fail_after(10):
                    while True:  # a Registered may come first; the stream then ends with the sentence
                        await link.receive()
            assert "reported the address '10.0.0.9\\nPrologSlurmctld" in str(caught.value)
            assert "Set the agent's address" in str(caught.value)
        assert plane.registry.get("evil") is None

        async with connect(f"127.0.0.1:{plane.agents_port}") as link:  # the same node with a real address joins
            await link.send(agent_message(register=pb.Register(node_id="evil", address="10.0.0.9", cpu_cores=2, node_secret=SECRET,
                                                               memory_total_bytes=1 << 30)))
            welcome = await link.receive()
            assert welcome.WhichOneof("body") == "registered"
            await wait_for(lambda: plane.registry.get("evil") is not None, 5, "the node registered")
            assert plane.registry.get("evil").state.address == "10.0.0.9"
        nursery.cancel_scope.cancel()


async def test_a_refused_register_displaces_no_session_of_the_same_node(tmp_path, settings_repo):
    """The address is checked before anything: a Register with a bad address for a connected node id gets no
    Registered, and the node's live stream stays its session."""
    plane = ControlPlane(ControlConfig(repo=str(settings_repo), state_dir=tmp_path / "state", gateway=False))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        async with connect(f"127.0.0.1:{plane.agents_port}") as good:
            await good.send(agent_message(register=pb.Register(node_id="n1", address="10.0.0.9", cpu_cores=2, node_secret=SECRET,
                                                               memory_total_bytes=1 << 30)))
            assert (await good.receive()).WhichOneof("body") == "registered"
            await wait_for(lambda: plane.is_connected("n1"), 5, "the node connected")
            session = plane.agents.sessions["n1"]
            async with connect(f"127.0.0.1:{plane.agents_port}") as evil:
                await evil.send(agent_message(register=pb.Register(node_id="n1", address=INJECTION, cpu_cores=2, node_secret=SECRET,
                                                                   memory_total_bytes=1 << 30)))
                with pytest.raises(WireError, match="is refused"):
                    with trio.fail_after(10):
                        await evil.receive()  # the sentence, never a Registered first
            assert plane.agents.sessions.get("n1") is session
            assert plane.registry.get("n1").state.address == "10.0.0.9"
        nursery.cancel_scope.cancel()
